"""The PyTorch images for real, on CPU: dinops-train makes synthetic data, trains a tiny model, is stopped with
`docker stop` (SIGTERM through tini) and checkpoints; a second container resumes. dinops-serve then serves that
checkpoint mounted read-only from a read-only root filesystem as a non-root user, and dinops-client, next to it on
a Docker network, passes a detection through."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from images.imagetools import APP_UID, post, wait_http

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]

TINY = "hidden_dim=32,nheads=2,num_queries=10,enc_layers=1,dec_layers=1,dim_feedforward=64,dn_number=4,num_select=10"
HARDENED = ("--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges")


def _train_args(*extra: str) -> list[str]:
    return [
        "dinops", "train", "--data-root", "/data", "--output-dir", "/out",
        "--model", "tiny", "--model-overrides", TINY,
        "--train-scales", "56,64", "--crop-scales", "64", "--crop-size", "40,64",
        "--max-size", "64", "--eval-size", "64",
        "--batch-size", "2", "--num-workers", "0", "--device", "cpu", "--print-freq", "1", "--tensorboard", "false",
        "--eval-every", "0", *extra,
    ]  # fmt: skip


def _wait_for_text(path: Path, text: str, container: str, docker, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text():
            return
        if docker("inspect", "--format", "{{.State.Running}}", container).stdout.strip() != "true":
            raise AssertionError(f"{container} ended before {text!r} appeared:\n{docker.logs(container)[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{text!r} did not appear in {path} within {timeout} s")


def _own(path: Path) -> Path:
    path.mkdir()
    os.chown(path, APP_UID, APP_UID)
    return path


@pytest.fixture(scope="module")
def training(images, docker, tmp_path_factory):
    """Synthetic data, a run stopped by `docker stop`, and the resumed run: what each step left behind."""
    root = tmp_path_factory.mktemp("train")
    data, out = _own(root / "data"), _own(root / "out")
    image = images["train"]
    env = ("-e", "OMP_NUM_THREADS=1")
    docker("run", "--rm", *HARDENED, "-v", f"{data}:/data", image,
           "dinops", "synth", "--out", "/data", "--train-images", "200", "--val-images", "4",
           "--image-size", "64", "--categories", "3", "--seed", "5", timeout=300)  # fmt: skip

    first = docker.name("container", "train-first")
    docker("run", "-d", "--name", first, *HARDENED, *env, "-v", f"{data}:/data:ro", "-v", f"{out}:/out", image,
           *_train_args("--epochs", "50", "--checkpoint-steps", "0"))  # fmt: skip
    _wait_for_text(out / "console.log", "2/100]", first, docker)  # "[  2/100]"
    stopped = time.monotonic()
    docker("stop", "--time", "120", first, timeout=180)
    stop_s = time.monotonic() - stopped
    first_state = docker.inspect(first)["State"]
    first_logs = docker.logs(first)
    stopped_checkpoint = torch.load(out / "checkpoint.pth", map_location="cpu", weights_only=False)

    second = docker.name("container", "train-resumed")
    docker("run", "--name", second, *HARDENED, *env, "-v", f"{data}:/data:ro", "-v", f"{out}:/out", image,
           *_train_args("--epochs", "1", "--resume", "auto"), timeout=600)  # fmt: skip
    return {
        "data": data,
        "out": out,
        "stop_s": stop_s,
        "first_state": first_state,
        "first_logs": first_logs,
        "stopped_checkpoint": stopped_checkpoint,
        "second_state": docker.inspect(second)["State"],
        "console": (out / "console.log").read_text(),
    }


def test_docker_stop_checkpoints_and_a_second_container_resumes(training):
    # 143 (128 + SIGTERM) after a checkpoint: training did not finish, so the container must not report success.
    assert training["first_state"]["ExitCode"] == 143, training["first_logs"][-3000:]
    assert training["stop_s"] < 100, "SIGTERM did not reach Python: docker stop had to SIGKILL"
    assert "received SIGTERM" in training["first_logs"]
    stopped = training["stopped_checkpoint"]
    assert stopped["next"]["epoch"] == 0 and 3 <= stopped["next"]["step"] < 100
    assert training["second_state"]["ExitCode"] == 0
    assert f"at epoch 0 step {stopped['next']['step']}" in training["console"]
    assert "resumed from" in training["console"]
    records = [json.loads(line) for line in (training["out"] / "log.txt").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0]
    final = torch.load(training["out"] / "checkpoint.pth", map_location="cpu", weights_only=False)
    assert final["global_step"] == 100 and final["next"] == {"epoch": 1, "step": 0}


@pytest.fixture(scope="module")
def api(images, docker, training):
    """dinops-serve on a Docker network (alias dino-api), the trained checkpoint mounted read-only."""
    # The model configuration in the official names, as DINO_CONFIG takes it (the checkpoint's `args` are the
    # training command's).
    final = torch.load(training["out"] / "checkpoint.pth", map_location="cpu", weights_only=False)
    (training["out"] / "model.json").write_text(json.dumps(final["model_config"]))
    network = docker.name("network", "serve-net")
    docker("network", "create", network)
    name = docker.name("container", "serve")
    docker(
        "run", "-d", "--name", name, *HARDENED, "--network", network, "--network-alias", "dino-api",
        "-p", "127.0.0.1::8000", "--health-interval", "2s", "--health-start-period", "300s",
        "-v", f"{training['out']}:/models:ro",
        "-e", "DINO_CHECKPOINT=/models/checkpoint.pth", "-e", "DINO_CONFIG=/models/model.json",
        "-e", "DINO_DEVICE=cpu", "-e", "DINO_WORKERS=1",
        images["serve"],
    )  # fmt: skip
    base = f"http://127.0.0.1:{docker.host_port(name, 8000)}"
    try:
        wait_http(base + "/readyz", timeout=300)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{docker.logs(name)[-3000:]}") from None
    return {"name": name, "network": network, "url": base}


def _jpeg(training) -> bytes:
    return next((training["data"] / "val2017").glob("*.jpg")).read_bytes()


def test_serve_detects_as_non_root_from_a_read_only_root(api, docker, training):
    status, body = post(api["url"] + "/v1/detect?threshold=0&max_detections=5", _jpeg(training), "image/jpeg")
    assert status == 200, body
    assert (body["width"], body["height"], body["device"]) == (64, 64, "cpu")
    assert len(body["detections"]) == 5
    assert {"box", "label", "name", "score"} == set(body["detections"][0])
    status, body = post(api["url"] + "/v1/detect", b"\xff\xd8\xff\xe0 not really a JPEG", "image/jpeg")
    assert 400 <= status < 500 and body.get("error"), body
    assert docker("exec", api["name"], "id", "-u").stdout.strip() == str(APP_UID)
    host_config = docker.inspect(api["name"])["HostConfig"]
    assert host_config["ReadonlyRootfs"] is True
    deadline = time.monotonic() + 60
    while docker.inspect(api["name"])["State"]["Health"]["Status"] != "healthy":
        assert time.monotonic() < deadline, docker.inspect(api["name"])["State"]["Health"]
        time.sleep(1)


def test_client_next_to_serve_on_a_docker_network(api, images, docker, training):
    name = docker.name("container", "client")
    docker(
        "run", "-d", "--name", name, *HARDENED, "--network", api["network"], "-p", "127.0.0.1::8080",
        "--health-interval", "2s", "-e", "DINO_API_URL=http://dino-api:8000", images["client"],
    )  # fmt: skip
    base = f"http://127.0.0.1:{docker.host_port(name, 8080)}"
    status, page = wait_http(base + "/", timeout=120)
    assert status == 200 and b"<html" in page.lower()
    status, ready = wait_http(base + "/readyz", timeout=60)
    assert json.loads(ready) == {"status": "ready", "api": "ready"}
    status, body = post(base + "/api/detect", _jpeg(training), "image/jpeg")
    assert status == 200, body
    assert (body["width"], body["height"]) == (64, 64)
    assert isinstance(body["detections"], list) and body["latency_ms"] > 0
    assert docker("exec", name, "id", "-u").stdout.strip() == str(APP_UID)
    deadline = time.monotonic() + 60
    while docker.inspect(name)["State"]["Health"]["Status"] != "healthy":
        assert time.monotonic() < deadline, docker.inspect(name)["State"]["Health"]
        time.sleep(1)
