"""The real thing: `dinops serve` under gunicorn on 127.0.0.1 with a small DINO checkpoint, real bytes over TCP."""

from __future__ import annotations

import io
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from PIL import Image

from dinops.serve.app import settings_config
from dinops.serve.detector import load_detector
from dinops.serve.testing import free_port, running, write_small_checkpoint

SERVER_ENV = {
    "DINO_MIN_SIZE": "64",
    "DINO_MAX_SIZE": "96",
    "DINO_BATCH_MAX_WAIT_MS": "200",
    "DINO_CPU_BATCH_MAX_SIZE": "8",  # batching on, as on a GPU: the batching test runs on a CPU
    "DINO_THREADS": "16",
}


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    return write_small_checkpoint(tmp_path_factory.mktemp("model") / "small.pth", seed=1)


@pytest.fixture(scope="session")
def server(checkpoint, tmp_path_factory):
    port = free_port()
    env = {**SERVER_ENV, "DINO_CHECKPOINT": str(checkpoint), "DINO_BIND": f"127.0.0.1:{port}"}
    log = tmp_path_factory.mktemp("logs") / "serve.log"
    with running("serve", env, f"http://127.0.0.1:{port}", log):
        yield {"url": f"http://127.0.0.1:{port}", "log": log}


def _jpeg(seed: int, size=(120, 90)) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise(size, 40 + seed).convert("RGB").save(buffer, "JPEG")
    return buffer.getvalue()


def _metric(url: str, name: str) -> float:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(name)


def test_ready_reports_model(server, checkpoint):
    body = requests.get(server["url"] + "/readyz", timeout=10).json()
    assert body["status"] == "ready" and body["device"] == "cpu" and body["checkpoint"] == str(checkpoint)
    assert body["backend"] in {"gather", "grid_sample", "pytorch", "cuda"}
    assert body["model"]["num_queries"] == 20 and body["model"]["backbone"] == "resnet18"


def test_detections_match_the_model_run_in_process(server, checkpoint):
    image = _jpeg(0)
    response = requests.post(
        server["url"] + "/v1/detect?threshold=0&max_detections=5", files={"image": ("x.jpg", image)}, timeout=60
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["width"], body["height"]) == (120, 90)
    config = settings_config({k: v for k, v in SERVER_ENV.items()} | {"DINO_CHECKPOINT": str(checkpoint)})
    detector = load_detector(config)
    decoded = Image.open(io.BytesIO(image)).convert("RGB")
    expected = detector.forward([detector.prepare(decoded)], [(90, 120)])[0]
    top = sorted(range(len(expected.scores)), key=lambda i: -expected.scores[i])[:5]
    assert [d["label"] for d in body["detections"]] == [expected.labels[i] for i in top]
    for got, i in zip(body["detections"], top, strict=True):
        assert got["score"] == pytest.approx(expected.scores[i], abs=1e-3)
        assert got["box"] == pytest.approx(expected.boxes[i], abs=0.05)
        assert 0 <= got["box"][0] <= got["box"][2] <= 120 and 0 <= got["box"][1] <= got["box"][3] <= 90


def test_legacy_endpoint_and_bad_bytes_over_tcp(server):
    legacy = requests.post(server["url"] + "/inference?threshold=0", files={"image": ("x.jpg", _jpeg(1))}, timeout=60)
    assert legacy.status_code == 200 and len(legacy.json()["boxes"]) == len(legacy.json()["scores"]) > 0
    assert all(0 <= c <= 1 for box in legacy.json()["boxes"] for c in box)
    broken = requests.post(
        server["url"] + "/v1/detect", data=_jpeg(2)[:300], headers={"Content-Type": "image/jpeg"}, timeout=60
    )
    assert broken.status_code == 400 and broken.json()["code"] == "corrupt_image"


def test_concurrent_requests_are_batched(server):
    url = server["url"]
    before_sum, before_count = _metric(url, "dino_batch_size_sum"), _metric(url, "dino_batch_size_count")
    images = [_jpeg(i) for i in range(12)]

    def post(image: bytes) -> dict:
        response = requests.post(url + "/v1/detect", data=image, headers={"Content-Type": "image/jpeg"}, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(post, images))
    assert _metric(url, "dino_batch_size_sum") - before_sum == 12
    forwards = _metric(url, "dino_batch_size_count") - before_count
    assert forwards < 12  # some requests shared a forward pass
    assert max(answer["timing"]["batch_size"] for answer in answers) > 1


def test_logs_are_json_lines(server):
    requests.get(server["url"] + "/healthz", timeout=10)

    def entries() -> list[dict]:
        return [json.loads(line) for line in server["log"].read_text().splitlines() if line.startswith("{")]

    # gunicorn writes the access line after the response has gone out: give the worker a moment to write it
    deadline = time.monotonic() + 10
    while not any(e["logger"] == "gunicorn.access" and "/healthz" in e["message"] for e in entries()):
        assert time.monotonic() < deadline, "no gunicorn.access line for /healthz within 10 s"
        time.sleep(0.1)
    assert any(e["message"] == "model ready" and e["logger"] == "dinops.serve.runtime" for e in entries())


def test_model_load_errors_name_the_file(checkpoint, tmp_path):
    from dinops.serve.detector import ModelLoadError

    def load(**env):
        return load_detector(settings_config(SERVER_ENV | {k: str(v) for k, v in env.items()}))

    with pytest.raises(ModelLoadError, match="no checkpoint given"):
        load()
    with pytest.raises(ModelLoadError, match=r"missing.pth does not exist"):
        load(DINO_CHECKPOINT=tmp_path / "missing.pth")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match=r"garbage.pth cannot be used"):
        load(DINO_CHECKPOINT=garbage)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"backbone": "resnet18", "hidden_dim": 32}))
    with pytest.raises(ModelLoadError, match="cannot build the model"):  # weights of another shape
        load(DINO_CHECKPOINT=checkpoint, DINO_CONFIG=config)
    names = tmp_path / "names.txt"
    names.write_text("\n".join(f"thing{i}" for i in range(91)))
    detector = load(DINO_CHECKPOINT=checkpoint, DINO_CLASS_NAMES=names)
    assert detector.class_names[5] == "thing5" and detector.info["class_names"] == str(names)


def test_a_dinops_training_checkpoint_serves_without_a_config(tmp_path):
    """`dinops train` stores its command's args and the model's full config as `model_config`: serve uses the latter."""
    from dataclasses import asdict

    import torch

    from dinops.model import DINOConfig, build_dino
    from dinops.serve.testing import SMALL_CONFIG

    cfg = DINOConfig(**SMALL_CONFIG, num_select=50)
    torch.manual_seed(3)
    model = build_dino(cfg)
    path = tmp_path / "checkpoint.pth"
    training_args = {"lr": 1e-4, "epochs": 12, "data_root": "/data", "output_dir": "/out", "batch_size": 2}
    torch.save({"model": model.state_dict(), "args": training_args, "model_config": asdict(cfg), "epoch": 3}, path)
    detector = load_detector(settings_config(SERVER_ENV | {"DINO_CHECKPOINT": str(path)}))
    assert detector.info["num_queries"] == 20 and detector.info["backbone"] == "resnet18"
    image = Image.open(io.BytesIO(_jpeg(2))).convert("RGB")
    (result,) = detector.forward([detector.prepare(image)], [(90, 120)])
    assert len(result.scores) > 0 and all(0.0 <= s <= 1.0 for s in result.scores)
