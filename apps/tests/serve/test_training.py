"""``GET /v1/training`` on a real server (gunicorn on 127.0.0.1) waiting for a training run's checkpoint: every state
of OUTPUT_DIR/progress.json, then the checkpoint it serves once one appears."""

from __future__ import annotations

import json
import time

import pytest
import requests

from dinops.serve.testing import write_small_checkpoint
from dinops.train.progress import write_atomic

from ..training_api import training as _training
from ..training_api import waiting_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_output")
    with waiting_server(out, DINO_MIN_SIZE="64", DINO_MAX_SIZE="96") as url:
        yield url, out


def test_needs_the_token(server):
    url, _ = server
    answer = requests.get(url + "/v1/training", timeout=10)
    assert answer.status_code == 401 and answer.json()["code"] == "unauthorized"


def test_the_states_of_the_progress_file(server):
    url, out = server
    progress = out / "progress.json"
    progress.unlink(missing_ok=True)
    assert _training(url) == {"state": "not_started", "progress_file": str(progress), "served": None}

    document = {
        "state": "training",
        "epoch": 1,
        "epochs": 12,
        "step": 40,
        "steps_per_epoch": 100,
        "global_step": 140,
        "loss_curve": [[1, 20.5], [140, 9.25]],
        "evaluations": [{"epoch": 0, "global_step": 100, "ap": 0.125, "ap50": 0.25, "ap75": 0.0625}],
    }
    write_atomic(progress, document)
    assert _training(url) == document | {"progress_file": str(progress), "served": None}

    for content, reason in (
        (b'{"state": "training", "epoch": ', "is not JSON"),
        (b"\xff\xfe not text", "is not JSON"),
        (b'["training"]', "is not a training progress document"),
        (json.dumps({"state": "sleeping"}).encode(), "is not a training progress document"),
        (b" " * (2 << 20), "is larger than"),
    ):
        progress.write_bytes(content)
        body = _training(url)
        assert body["state"] == "unreadable" and reason in body["reason"], (content[:40], body)
        assert str(progress) in body["reason"]
    progress.unlink()
    progress.mkdir()  # a folder where the file should be: unreadable, not a server error
    try:
        body = _training(url)
        assert body["state"] == "unreadable" and "cannot be read" in body["reason"]
    finally:
        progress.rmdir()


def test_says_which_checkpoint_it_serves_and_since_when(server):
    url, out = server
    write_atomic(out / "progress.json", {"state": "done", "global_step": 8})
    tmp = write_small_checkpoint(out / ".checkpoint.tmp", seed=1)
    tmp.rename(out / "checkpoint.pth")  # as training replaces it
    deadline = time.monotonic() + 120
    while (body := _training(url))["served"] is None:
        assert time.monotonic() < deadline, "the checkpoint was never loaded"
        time.sleep(0.2)
    assert body["state"] == "done" and body["global_step"] == 8
    served = body["served"]
    assert served["checkpoint"] == str(out / "checkpoint.pth")
    assert time.strptime(served["loaded_at"], "%Y-%m-%dT%H:%M:%SZ")
    health = requests.get(url + "/healthz", timeout=10).json()
    assert served["loaded_at"] == health["loaded"]["loaded_at"]
