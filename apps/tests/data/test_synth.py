from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from dinops.data.coco import load_annotations
from dinops.data.synth import CATEGORIES, SynthSpec, generate, main


def _digest(root):
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_layout_and_valid_annotations(synth_root):
    for split, count, first_id in (("train2017", 12, 1), ("val2017", 4, 100_001)):
        doc = load_annotations(synth_root / "annotations" / f"instances_{split}.json", synth_root / split)
        assert len(doc["images"]) == count
        assert doc["images"][0]["id"] == first_id
        assert [c["name"] for c in doc["categories"]] == [name for name, _ in CATEGORIES[:4]]
        assert {a["category_id"] for a in doc["annotations"]} <= {1, 2, 3, 4}
        per_image = {img["id"]: 0 for img in doc["images"]}
        for a in doc["annotations"]:
            per_image[a["image_id"]] += 1
            x, y, w, h = a["bbox"]
            assert x >= 0 and y >= 0 and x + w <= 96 and y + h <= 96 and w >= 8 and h >= 8
        assert min(per_image.values()) >= 1 and max(per_image.values()) <= SynthSpec().max_objects


def test_same_arguments_same_bytes(tmp_path):
    spec = SynthSpec(train_images=3, val_images=2, image_size=64, categories=2, seed=7)
    a, b = generate(spec, tmp_path / "a"), generate(spec, tmp_path / "b")
    assert _digest(a) == _digest(b)
    c = generate(SynthSpec(train_images=3, val_images=2, image_size=64, categories=2, seed=8), tmp_path / "c")
    assert _digest(a) != _digest(c)


def test_shapes_are_drawn_inside_their_boxes(synth_root):
    doc = json.loads((synth_root / "annotations" / "instances_train2017.json").read_text())
    ann = next(a for a in doc["annotations"] if a["category_id"] == 2 and a["bbox"][2] >= 16)  # a blue square
    image = np.asarray(Image.open(synth_root / "train2017" / f"{ann['image_id']:012d}.jpg"), dtype=np.int32)
    x, y, w, h = (int(v) for v in ann["bbox"])
    centre = image[y + h // 2, x + w // 2]
    assert centre[2] > centre[0] + 60  # blue dominates where the square is (unless occluded, which the seed avoids)


def test_cli_rejects_bad_arguments(tmp_path, caplog):
    assert main(["--out", str(tmp_path / "x"), "--categories", "99"]) == 2
    assert "--categories must be between 1 and 8" in caplog.text
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("field,value", [("min_objects", 0), ("max_occlusion", 1.5), ("image_size", 8)])
def test_spec_check(field, value):
    with pytest.raises(ValueError):
        SynthSpec(**{field: value}).check()
