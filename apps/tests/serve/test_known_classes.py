"""Only the classes a model was trained on are answered, by every protocol; the model's postprocess stays official.

DINO's class head has max category id + 1 outputs: a model trained on the synthetic shapes (ids 1-3) has 4, and
its output 0 is no class of the dataset, as COCO's 11 unused ids of 91 are none of COCO's 80.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict

import pytest
import torch
from PIL import Image

from dinops import model as dino_model
from dinops.serve.app import settings_config
from dinops.serve.classes import COCO_NAMES, ClassNames
from dinops.serve.detector import Detector, ModelLoadError, load_detector
from dinops.serve.testing import SMALL_CONFIG, noise_jpeg

SHAPES = [{"id": 1, "name": "circle"}, {"id": 2, "name": "square"}, {"id": 3, "name": "triangle"}]
QUERIES = SMALL_CONFIG["num_queries"]
# 128: at 64 pixels the small model's last feature level is 1x1, which GroupNorm refuses for a single image
SIZES = {"DINO_MIN_SIZE": "128", "DINO_MAX_SIZE": "128", "DINO_WARMUP": "false"}


def _write(path, num_classes: int, **extra) -> str:
    """A random-weight checkpoint with ``num_classes`` class outputs, stored as `dinops train` stores one."""
    cfg = dino_model.DINOConfig(**{**SMALL_CONFIG, "num_classes": num_classes, "dn_labelbook_size": num_classes})
    torch.manual_seed(4)
    model = dino_model.build_dino(cfg)
    torch.save({"model": model.state_dict(), "args": {"epochs": 1}, "model_config": asdict(cfg), **extra}, path)
    return str(path)


def _load(path, **env) -> Detector:
    return load_detector(settings_config({**SIZES, "DINO_CHECKPOINT": str(path), **env}))


@pytest.fixture(scope="module")
def shapes_detector(tmp_path_factory):
    return _load(_write(tmp_path_factory.mktemp("shapes") / "shapes.pth", 4, categories=SHAPES))


def _v1_detect(client, image, count):
    response = client.post(
        f"/v1/detect?threshold=0&max_detections={count}", data=image, headers={"Content-Type": "image/jpeg"}
    )
    assert response.status_code == 200, response.get_json()
    return [(d["label"], d["name"]) for d in response.get_json()["detections"]]


def _inference(client, image, count):
    response = client.post("/inference?threshold=0", data=image, headers={"Content-Type": "image/jpeg"})
    assert response.status_code == 200, response.get_json()
    return [(label, None) for label in response.get_json()["labels"]]


def _kserve_v1(client, image, count):
    body = {
        "instances": [{"image": {"b64": base64.b64encode(image).decode()}}],
        "parameters": {"threshold": 0, "max_detections": count},
    }
    response = client.post("/v1/models/dino:predict", json=body)
    assert response.status_code == 200, response.get_json()
    (prediction,) = response.get_json()["predictions"]
    return [(d["label"], d["name"]) for d in prediction["detections"]]


def _oip_v2(client, image, count):
    tensor = {"name": "image", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(image).decode()]}
    body = {"inputs": [tensor], "parameters": {"threshold": 0, "max_detections": count}}
    response = client.post("/v2/models/dino/infer", json=body)
    assert response.status_code == 200, response.get_json()
    outputs = {o["name"]: o["data"] for o in response.get_json()["outputs"]}
    (found,) = outputs["num_detections"]
    return [(label, None) for label in outputs["labels"][:found]]


@pytest.mark.parametrize("ask", [_v1_detect, _inference, _kserve_v1, _oip_v2])
def test_every_protocol_answers_only_the_stored_categories(make_app, shapes_detector, ask):
    """threshold 0 and room for every (query, class) pair of the dataset: all of them come, and nothing else."""
    client = make_app(DETECTOR=shapes_detector).test_client()
    found = ask(client, noise_jpeg(3), QUERIES * len(SHAPES))
    assert len(found) == QUERIES * len(SHAPES)
    assert {label for label, _ in found} == {1, 2, 3}
    named = {c["id"]: c["name"] for c in SHAPES}
    assert all(name is None or name == named[label] for label, name in found)


def test_a_class_the_model_does_not_know_cannot_be_asked_for(make_app, shapes_detector):
    client = make_app(DETECTOR=shapes_detector).test_client()
    image = {"data": noise_jpeg(3), "headers": {"Content-Type": "image/jpeg"}}
    refused = client.post("/v1/detect?threshold=0&classes=0", **image)
    assert refused.status_code == 400
    assert refused.get_json()["error"] == "classes: '0' is not a class of this model (its ids: 1, 2, 3)."
    kept = client.post("/v1/detect?threshold=0&classes=square,3", **image).get_json()["detections"]
    assert {d["label"] for d in kept} == {2, 3} and len(kept) == 2 * QUERIES


class ZeroFirst(torch.nn.Module):
    """Every query's best class is 0 (no class of the shapes), then 3, 2, 1: the official top-k takes only 0s."""

    def __init__(self, queries: int = 5) -> None:
        super().__init__()
        self.register_buffer("logits", torch.tensor([[4.0, -3.0, -2.0, -1.0]]).repeat(queries, 1))
        self.register_buffer("boxes", torch.tensor([[0.5, 0.5, 0.2, 0.2]]).repeat(queries, 1))

    def forward(self, images, mask):
        batch = images.shape[0]
        return {"pred_logits": self.logits.expand(batch, -1, -1), "pred_boxes": self.boxes.expand(batch, -1, -1)}


def test_top_k_is_taken_over_the_known_classes_and_the_postprocess_stays_official():
    model = ZeroFirst()
    outputs = model(torch.zeros(1, 3, 8, 8), torch.zeros(1, 8, 8, dtype=torch.bool))
    official = dino_model.postprocess(outputs, torch.tensor([[100.0, 100.0]]), num_select=5)[0]
    assert official["labels"].tolist() == [0] * 5  # the official PostProcess: top-k over every (query, class)

    names = ClassNames({c["id"]: c["name"] for c in SHAPES}, "checkpoint")
    detector = Detector(
        model=model, postprocess=dino_model.postprocess, pad_images=dino_model.pad_images, class_names=names,
        min_size=32, max_size=32, num_select=5,
    )  # fmt: skip
    (prediction,) = detector.forward([detector.prepare(Image.new("RGB", (32, 32)))], [(32, 32)])
    assert prediction.labels == [3] * 5  # the 5 best known pairs: every query's class 3
    assert prediction.scores == pytest.approx([torch.sigmoid(torch.tensor(-1.0)).item()] * 5)

    detector.num_select = 300  # more than the 5 queries x 3 known classes: all 15, none of class 0
    (prediction,) = detector.forward([detector.prepare(Image.new("RGB", (32, 32)))], [(32, 32)])
    assert sorted(prediction.labels) == [1] * 5 + [2] * 5 + [3] * 5


def test_a_checkpoint_without_categories_with_cocos_91_outputs_answers_cocos_80(make_app, tmp_path):
    detector = _load(_write(tmp_path / "coco.pth", 91))
    assert detector.info["class_names"] == "coco" and detector.class_names.ids == tuple(sorted(COCO_NAMES))
    client = make_app(DETECTOR=detector).test_client()
    found = _v1_detect(client, noise_jpeg(3), 100)
    assert len(found) == 100 and all(COCO_NAMES[label] == name for label, name in found)


def test_a_checkpoint_without_categories_and_another_class_count_is_refused_with_the_fix(tmp_path):
    path = _write(tmp_path / "unnamed.pth", 4)
    with pytest.raises(ModelLoadError) as refused:
        _load(path)
    assert str(refused.value) == (
        f"checkpoint {path} stores no categories and its class head has 4 outputs, not COCO's 91, so which of "
        "ids 0-3 are classes is unknown: set DINO_CLASS_NAMES to the training annotation file (its categories), "
        'or to a JSON object {"<id>": "<name>"} of the classes'
    )
    names = tmp_path / "names.json"
    names.write_text(json.dumps({"images": [], "annotations": [], "categories": SHAPES}))
    detector = _load(path, DINO_CLASS_NAMES=str(names))
    assert detector.class_names.ids == (1, 2, 3) and detector.info["class_names"] == str(names)


def test_class_names_beyond_the_class_head_are_refused(tmp_path):
    path = _write(tmp_path / "shapes.pth", 4, categories=SHAPES)
    names = tmp_path / "names.json"
    names.write_text(json.dumps({"1": "circle", "7": "star"}))
    with pytest.raises(ModelLoadError, match=rf"{names} names class ids the model cannot predict: 7 \(its class "):
        _load(path, DINO_CLASS_NAMES=str(names))
