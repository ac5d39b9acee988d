from __future__ import annotations

import copy
import json

import pytest
import torch
from torchvision import tv_tensors

from dinops.data.coco import AnnotationError, CocoDetection, class_counts, load_annotations
from dinops.data.transforms import eval_transforms


@pytest.fixture(scope="module")
def val_doc(synth_root):
    return json.loads((synth_root / "annotations" / "instances_val2017.json").read_text())


def _write(tmp_path, doc):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def _break(doc, what):
    doc = copy.deepcopy(doc)
    ann = doc["annotations"][0]
    if what == "unknown category":
        ann["category_id"] = 77
    elif what == "degenerate":
        ann["bbox"][2] = 0
    elif what == "outside":
        ann["bbox"][0] = 90.0
    elif what == "unknown image":
        ann["image_id"] = 5
    elif what == "empty":
        doc["images"], doc["annotations"] = [], []
    elif what == "duplicate image":
        doc["images"].append(dict(doc["images"][0]))
    elif what == "bad bbox":
        ann["bbox"] = [1, 2, 3]
    elif what == "missing file":
        doc["images"][1]["file_name"] = "nowhere.jpg"
    return doc


@pytest.mark.parametrize(
    "what,message",
    [
        ("unknown category", "unknown category id 77 (known: [1, 2, 3, 4])"),
        ("degenerate", "degenerate box"),
        ("outside", "lies outside image"),
        ("unknown image", "unknown image id 5"),
        ("empty", "empty dataset: no images"),
        ("duplicate image", "appears twice"),
        ("bad bbox", "bbox must be [x, y, width, height]"),
        ("missing file", "1 image file(s) missing"),
    ],
)
def test_bad_annotations_are_named(tmp_path, synth_root, val_doc, what, message):
    path = _write(tmp_path, _break(val_doc, what))
    with pytest.raises(AnnotationError) as err:
        load_annotations(path, synth_root / "val2017")
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_not_json_and_missing_keys(tmp_path):
    with pytest.raises(AnnotationError, match="not valid JSON"):
        load_annotations(_write(tmp_path, "{oops"))
    with pytest.raises(AnnotationError, match="missing or not a list: annotations, categories"):
        load_annotations(_write(tmp_path, {"images": []}))
    with pytest.raises(AnnotationError, match="annotation file not found"):
        load_annotations(tmp_path / "absent.json")


def test_many_problems_are_counted(tmp_path, val_doc):
    doc = copy.deepcopy(val_doc)
    for ann in doc["annotations"]:
        ann["category_id"] = 50
    with pytest.raises(AnnotationError) as err:
        load_annotations(_write(tmp_path, doc))
    assert f"{len(doc['annotations'])} problem(s)" in str(err.value)
    assert "more" in str(err.value)


def test_class_counts_follow_category_ids(val_doc):
    assert class_counts(val_doc) == (5, 5)
    coco_like = {"categories": [{"id": 1}, {"id": 90}]}
    assert class_counts(coco_like) == (91, 91)


def test_sample_boxes_are_normalised_cxcywh(synth_root, val_doc):
    ds = CocoDetection(
        synth_root / "val2017", synth_root / "annotations" / "instances_val2017.json", eval_transforms(128, 1333)
    )
    image, target = ds[0]
    assert image.dtype == torch.float32 and image.shape == (3, 128, 128)
    assert type(target["boxes"]) is torch.Tensor  # plain tensor, not a tv_tensor
    anns = [a for a in val_doc["annotations"] if a["image_id"] == ds.images[0]["id"]]
    x, y, w, h = anns[0]["bbox"]
    expected = torch.tensor([(x + w / 2) / 96, (y + h / 2) / 96, w / 96, h / 96])
    torch.testing.assert_close(target["boxes"][0], expected, atol=1e-5, rtol=0)
    assert target["labels"].tolist() == [a["category_id"] for a in anns]
    assert target["orig_size"].tolist() == [96, 96] and target["size"].tolist() == [128, 128]
    assert ds.num_classes == 5


def test_raw_sample_and_cache(tmp_path, synth_root):
    ann = synth_root / "annotations" / "instances_val2017.json"
    plain = CocoDetection(synth_root / "val2017", ann)
    cached = CocoDetection(synth_root / "val2017", ann, cache_dir=tmp_path / "cache")
    image, target = plain[1]
    assert isinstance(image, tv_tensors.Image) and isinstance(target["boxes"], tv_tensors.BoundingBoxes)
    first = cached[1][0]
    files = list((tmp_path / "cache").rglob("*.img"))
    assert len(files) == 1
    assert torch.equal(first, image) and torch.equal(cached[1][0], image)
    again = CocoDetection(synth_root / "val2017", ann, cache_dir=tmp_path / "cache")  # a later run reuses the cache
    assert again.cache.root == cached.cache.root
