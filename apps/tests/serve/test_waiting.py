"""Serving without a model: DINO_WAIT_FOR_MODEL=true. Healthy while waiting, 503 for readiness and detection,
the checkpoint loaded once it appears; a corrupt file is 'failed' and retried when it changes."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest
import requests
from PIL import Image

from dinops.serve.testing import free_port, running, write_small_checkpoint

from .conftest import replace_file

SERVER_ENV = {"DINO_MIN_SIZE": "64", "DINO_MAX_SIZE": "96", "DINO_THREADS": "4", "DINO_MODEL_POLL_S": "0.2"}
WAITING = "waiting for a model: {} does not exist yet; train, or give a checkpoint"


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((120, 90), 50).convert("RGB").save(buffer, "PNG")
    return buffer.getvalue()


def _until(condition, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _metric(url: str, state: str) -> float:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f'dino_model_state{{state="{state}"}} '):
            return float(line.split()[-1])
    raise AssertionError(state)


# --- in process, a fake loader (fast) ---------------------------------------------------------------------------


@pytest.fixture
def waiting_app(make_app, fake_model, tmp_path):
    path = tmp_path / "models" / "model.pth"
    loads = []

    def loader(config):
        text = path.read_text()
        loads.append(text)
        if text != "good":
            raise RuntimeError(f"checkpoint {path} cannot be used: corrupt")
        return fake_model()[1]

    app = make_app(
        DETECTOR=None, DETECTOR_LOADER=loader, START=False, WAIT_FOR_MODEL=True, CHECKPOINT=str(path), MODEL_POLL_S=0.05
    )
    return app, path, loads


def test_waiting_then_ready_in_process(waiting_app, encode):
    app, path, loads = waiting_app
    client = app.test_client()
    health = client.get("/healthz")
    assert health.status_code == 200
    assert health.get_json() == {
        "status": "alive",
        "model": "waiting",
        "checkpoint": str(path),
        "reload": {"enabled": True, "poll_s": 0.05, "reloads": 0},  # DINO_RELOAD=auto: on with WAIT_FOR_MODEL
    }
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.get_json()["status"] == "waiting for a model"
    assert ready.get_json()["checkpoint"] == str(path)
    image = encode(Image.new("RGB", (80, 60)))
    for endpoint in ("/v1/detect", "/inference"):
        busy = client.post(endpoint, data=image, content_type="image/png")
        body = busy.get_json()
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        assert body["code"] == "model_waiting" and body["error"] == WAITING.format(path)
        assert body["checkpoint"] == str(path)
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'dino_model_state{state="waiting"} 1.0' in metrics and 'dino_model_state{state="ready"} 0.0' in metrics

    path.parent.mkdir()
    replace_file(path, "good")
    assert app.extensions["dino"].wait(10)
    assert client.get("/readyz").status_code == 200
    assert client.get("/healthz").get_json()["model"] == "ready"
    assert client.post("/v1/detect", data=image, content_type="image/png").status_code == 200
    time.sleep(0.2)
    assert loads == ["good"]  # loaded once


def test_failed_load_is_retried_when_the_file_changes(waiting_app, encode):
    app, path, loads = waiting_app
    client = app.test_client()
    path.parent.mkdir()
    path.write_text("half a file")
    client.get("/healthz")  # starts the runtime
    _until(lambda: client.get("/healthz").get_json()["model"] == "failed", 10, "failed")
    assert client.get("/healthz").get_json()["error"]  # the reason, for the workloads stage
    body = client.get("/readyz").get_json()
    assert body["status"] == "failed" and "corrupt" in body["error"] and body["checkpoint"] == str(path)
    failed = client.post("/v1/detect", data=encode(Image.new("RGB", (80, 60))), content_type="image/png")
    assert failed.status_code == 503 and failed.get_json()["code"] == "model_failed"
    assert "corrupt" in failed.get_json()["error"] and failed.headers["Retry-After"]
    time.sleep(0.3)
    assert loads == ["half a file"]  # not retried while the file stays the same: no crash loop, no load loop
    path.unlink()
    _until(lambda: client.get("/healthz").get_json()["model"] == "waiting", 10, "waiting again")
    replace_file(path, "good")
    assert app.extensions["dino"].wait(10)
    assert client.get("/healthz").get_json()["model"] == "ready" and loads == ["half a file", "good"]


def test_an_existing_checkpoint_loads_at_once(waiting_app):
    app, path, loads = waiting_app
    path.parent.mkdir()
    path.write_text("good")
    app.extensions["dino"].start()
    assert app.extensions["dino"].wait(10) and loads == ["good"]


# --- the real server ------------------------------------------------------------------------------------------


def _serve_env(path, port) -> dict[str, str]:
    return {**SERVER_ENV, "DINO_CHECKPOINT": str(path), "DINO_BIND": f"127.0.0.1:{port}", "DINO_WAIT_FOR_MODEL": "true"}


def test_real_server_waits_for_a_model_then_serves_it(tmp_path):
    path = tmp_path / "out" / "checkpoint.pth"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running("serve", _serve_env(path, port), url, tmp_path / "serve.log", ready="/healthz"):
        health = requests.get(url + "/healthz", timeout=10)
        assert health.status_code == 200
        assert health.json() == {
            "status": "alive",
            "model": "waiting",
            "checkpoint": str(path),
            "reload": {"enabled": True, "poll_s": 0.2, "reloads": 0},
        }
        ready = requests.get(url + "/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json()["status"] == "waiting for a model" and ready.json()["checkpoint"] == str(path)
        detect = requests.post(url + "/v1/detect", data=_png(), headers={"Content-Type": "image/png"}, timeout=30)
        assert detect.status_code == 503 and detect.headers["Retry-After"]
        assert detect.json()["error"] == WAITING.format(path) and detect.json()["code"] == "model_waiting"
        assert _metric(url, "waiting") == 1

        path.parent.mkdir()
        write_small_checkpoint(tmp_path / "checkpoint.tmp", seed=1)
        os.replace(tmp_path / "checkpoint.tmp", path)
        _until(lambda: requests.get(url + "/readyz", timeout=10).status_code == 200, 120, "readyz 200")
        assert requests.get(url + "/healthz", timeout=10).json()["model"] == "ready"
        detect = requests.post(
            url + "/v1/detect?threshold=0", data=_png(), headers={"Content-Type": "image/png"}, timeout=60
        )
        assert detect.status_code == 200, detect.text
        assert len(detect.json()["detections"]) > 0
        assert _metric(url, "ready") == 1 and _metric(url, "waiting") == 0
    assert "waiting for a model" in (tmp_path / "serve.log").read_text()


def test_real_server_corrupt_checkpoint_fails_then_recovers(tmp_path):
    path = tmp_path / "checkpoint.pth"
    path.write_bytes(b"not a checkpoint at all")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running("serve", _serve_env(path, port), url, tmp_path / "serve.log", ready="/healthz") as process:
        _until(lambda: requests.get(url + "/healthz", timeout=10).json()["model"] == "failed", 60, "failed")
        ready = requests.get(url + "/readyz", timeout=10)
        assert ready.status_code == 503 and "cannot be used" in ready.json()["error"]
        detect = requests.post(url + "/v1/detect", data=_png(), headers={"Content-Type": "image/png"}, timeout=30)
        assert detect.status_code == 503 and "cannot be used" in detect.json()["error"]
        assert process.poll() is None  # still serving: no crash loop
        write_small_checkpoint(tmp_path / "good.tmp", seed=2)
        os.replace(tmp_path / "good.tmp", path)
        _until(lambda: requests.get(url + "/readyz", timeout=10).status_code == 200, 120, "readyz 200")
        assert requests.get(url + "/healthz", timeout=10).json()["model"] == "ready"


def test_without_wait_for_model_a_missing_checkpoint_is_still_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")}
    env |= {"DINO_CHECKPOINT": str(tmp_path / "missing.pth"), "DINO_BIND": f"127.0.0.1:{free_port()}"}
    result = subprocess.run(
        [sys.executable, "-m", "dinops.cli", "serve"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "missing.pth: no such file" in result.stderr
