"""A model trained on other data than COCO is served with its own class names, never COCO's: end to end, from
`dinops train` through every checkpoint file it writes to a real `dinops serve` on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import requests
import torch

from dinops.serve.app import settings_config
from dinops.serve.classes import COCO_NAMES
from dinops.serve.detector import ModelLoadError, load_detector
from dinops.serve.testing import free_port, running
from dinops.train import checkpoints

from .conftest import tiny_train_args

# 128: at 64 pixels the tiny model's last feature level is 1x1, which GroupNorm refuses for a single image
SERVER_ENV = {"DINO_MIN_SIZE": "128", "DINO_MAX_SIZE": "128", "DINO_THREADS": "4", "DINO_TORCH_THREADS": "1"}


@pytest.fixture(scope="module")
def trained(train_synth, tmp_path_factory):
    """One epoch (8 steps) with evaluation: the latest, the numbered and the best checkpoint."""
    out = tmp_path_factory.mktemp("named")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")} | {"OMP_NUM_THREADS": "1"}
    args = tiny_train_args(train_synth, out, "--epochs", "1", "--checkpoint-steps", "3")
    done = subprocess.run(
        [sys.executable, "-m", "dinops.cli", "train", *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((train_synth / "annotations" / "instances_train2017.json").read_text())
    return out, [{"id": c["id"], "name": c["name"]} for c in document["categories"]]


def test_every_checkpoint_stores_the_training_categories(trained):
    out, categories = trained
    assert [c["name"] for c in categories] == ["circle", "square", "triangle"]
    for name in (checkpoints.LATEST, checkpoints.numbered(0), checkpoints.BEST):
        assert checkpoints.load(out / name)["categories"] == categories, name


def _val_image(train_synth) -> bytes:
    first = sorted((train_synth / "val2017").glob("*.jpg"))[0]
    return first.read_bytes()


def test_the_server_names_detections_after_the_training_data(trained, train_synth, tmp_path):
    out, categories = trained
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**SERVER_ENV, "DINO_CHECKPOINT": str(out / checkpoints.LATEST), "DINO_BIND": f"127.0.0.1:{port}"}
    with running("serve", env, url, tmp_path / "serve.log"):
        response = requests.post(
            url + "/v1/detect?threshold=0&max_detections=10",
            files={"image": ("val.jpg", _val_image(train_synth), "image/jpeg")},
            timeout=60,
        )
        health = requests.get(url + "/healthz", timeout=10).json()
    assert response.status_code == 200, response.text
    detections = response.json()["detections"]
    assert len(detections) == 10  # threshold 0: the untrained model's top 10, whatever their scores
    by_id = {c["id"]: c["name"] for c in categories}
    for detection in detections:  # never the class head's output 0, which is no category of the dataset
        assert detection["label"] in by_id and detection["name"] == by_id[detection["label"]], detection
    assert response.json()["model"]["class_names"] == "checkpoint"
    assert health["loaded"]["class_names"] == "checkpoint"


def _load(path, **env):
    config = settings_config({"DINO_CHECKPOINT": str(path), "DINO_WARMUP": "false", **env})
    return load_detector(config)


def test_a_checkpoint_without_names_is_refused_unless_it_has_cocos_class_count(trained, tmp_path):
    out, _ = trained
    ckpt = checkpoints.load(out / checkpoints.LATEST)
    del ckpt["categories"]
    unnamed = tmp_path / "unnamed.pth"
    torch.save(ckpt, unnamed)
    with pytest.raises(ModelLoadError, match="stores no categories and its class head has 4 outputs.*DINO_CLASS_NAMES"):
        _load(unnamed)

    coco_sized = {**ckpt, "model_config": {**ckpt["model_config"], "num_classes": 91, "dn_labelbook_size": 91}}
    from dinops.model import DINOConfig, build_dino

    coco_sized["model"] = build_dino(
        DINOConfig(**coco_sized["model_config"]).replace(backbone_weights=None)
    ).state_dict()
    coco_path = tmp_path / "coco_sized.pth"
    torch.save(coco_sized, coco_path)
    detector = _load(coco_path)
    assert detector.info["class_names"] == "coco" and detector.class_names.ids == tuple(sorted(COCO_NAMES))


def test_an_explicit_names_file_wins_over_the_stored_names(trained, tmp_path):
    out, _ = trained
    names = tmp_path / "names.json"
    names.write_text(json.dumps([{"id": 1, "name": "ball"}, {"id": 2, "name": "box"}, {"id": 3, "name": "wedge"}]))
    detector = _load(out / checkpoints.LATEST, DINO_CLASS_NAMES=str(names))
    assert detector.info["class_names"] == str(names) and detector.class_names.table == {
        1: "ball",
        2: "box",
        3: "wedge",
    }


def test_eval_warns_when_the_evaluation_file_names_the_ids_differently(
    trained, train_synth, tmp_path, caplog, no_dino_env
):
    from dinops.train.evaluate import main as eval_main

    out, _ = trained
    other = tmp_path / "data"
    (other / "annotations").mkdir(parents=True)
    (other / "val2017").symlink_to(train_synth / "val2017")
    document = json.loads((train_synth / "annotations" / "instances_val2017.json").read_text())
    document["categories"][1]["name"] = "person"
    (other / "annotations" / "instances_val2017.json").write_text(json.dumps(document))
    common = ["--eval-size", "64", "--max-size", "64", "--num-workers", "0", "--device", "cpu"]
    for root in (train_synth, other):
        out_json = tmp_path / f"{root.name}.json"
        assert (
            eval_main([str(out / checkpoints.LATEST), "--data-root", str(root), *common, "--output", str(out_json)])
            == 0
        )
    assert caplog.text.count("names category ids differently") == 1  # only for the other file
    assert "2: trained 'square' vs 'person'" in caplog.text
