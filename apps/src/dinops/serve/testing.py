"""A small DINO checkpoint with random weights, and a real server process, for tests and benchmarks.

The model is tiny (ResNet-18, 64-d transformer, one encoder and one decoder layer, 20 queries) so that a
forward pass on a small image takes well under a second on a CPU; its detections are meaningless but
deterministic for a seed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

SMALL_CONFIG: dict[str, Any] = {
    "backbone": "resnet18",
    "hidden_dim": 64,
    "nheads": 4,
    "enc_layers": 1,
    "dec_layers": 1,
    "dim_feedforward": 128,
    "num_queries": 20,
    "num_classes": 91,
    "use_dn": False,
    "dn_number": 0,
    "lr_backbone": 0.0,
}


def write_small_checkpoint(path: str | Path, seed: int = 0, **extra: Any) -> Path:
    """Write a checkpoint as training does (``model``, ``args``, plus ``extra`` such as ``class_names``)."""
    import torch

    from dinops.model import DINOConfig, build_dino, save_checkpoint

    torch.manual_seed(seed)
    config = DINOConfig(**SMALL_CONFIG)
    save_checkpoint(path, build_dino(config), config, **extra)
    return Path(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running(
    command: str, env: Mapping[str, str], url: str, log_path: Path, ready: str = "/readyz", timeout: float = 300
) -> Iterator[subprocess.Popen]:
    """Run ``dinops <command>`` until ``url + ready`` answers 200 (``/readyz`` saying the model failed to load ends the
    wait at once); stop it (SIGTERM, then SIGKILL) afterwards."""
    import requests

    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "dinops.cli", command],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"dinops {command} exited with {process.returncode}:\n{log_path.read_text()[-3000:]}"
                )
            try:
                answer = requests.get(url + ready, timeout=2)
                if answer.status_code == 200:
                    break
                if ready == "/readyz" and answer.json().get("status") == "failed":  # no point waiting 300 s more
                    raise RuntimeError(
                        f"dinops {command}: {answer.json().get('error')}\n{log_path.read_text()[-3000:]}"
                    )
            except (requests.RequestException, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"dinops {command} not ready after {timeout} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def small_server(folder: Path, env: Mapping[str, str], seed: int = 0, ready: str = "/readyz") -> Iterator[str]:
    """`dinops serve` on a free port of 127.0.0.1 with a small checkpoint written into ``folder`` (unless ``env``
    names another ``DINO_CHECKPOINT``); yields its URL. The log is ``folder/serve.log``."""
    port = free_port()
    settings = {"DINO_CHECKPOINT": str(folder / "small.pth"), **env, "DINO_BIND": f"127.0.0.1:{port}"}
    if "DINO_CHECKPOINT" not in env:
        write_small_checkpoint(folder / "small.pth", seed=seed)
    url = f"http://127.0.0.1:{port}"
    with running("serve", settings, url, folder / "serve.log", ready=ready):
        yield url


def noise_jpeg(seed: int, size: tuple[int, int] = (120, 90)) -> bytes:
    """A JPEG of random pixels, the same for a seed on every run (Image.effect_noise draws from an unseeded
    generator)."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


def _status(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (gunicorn's workers under its master), from ``/proc/*/stat``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


class WorkerMemory:
    """The peak memory of one server worker while a load runs, and a stand-in for the container's OOM killer.

    ``start()`` resets the kernel's high-water mark of the worker's resident memory (``echo 5 >
    /proc/<pid>/clear_refs``, proc(5)) and takes the baseline; a thread samples ``VmRSS`` every ``interval`` s and,
    once it grows past the baseline by ``kill_above`` bytes, SIGKILLs the worker as a memory limit would (a worker
    that the limit ends is what a hostile load must never cause). ``stop()`` returns the peak growth over the
    baseline in bytes (the kernel's ``VmHWM``, which misses no spike between samples)."""

    def __init__(self, pid: int, kill_above: int, interval: float = 0.01) -> None:
        self.pid, self.kill_above, self.interval = pid, kill_above, interval
        self.baseline = 0
        self.killed_at: int | None = None
        self._peak = 0
        self._stop = None
        self._thread = None

    def start(self) -> WorkerMemory:
        import threading

        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        self.baseline = _status(self.pid, "VmRSS")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        import signal

        while not self._stop.wait(self.interval):
            try:
                rss = _status(self.pid, "VmRSS")
            except (OSError, KeyError):
                return
            if rss - self.baseline > self.kill_above:
                self.killed_at = rss - self.baseline
                os.kill(self.pid, signal.SIGKILL)
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        if self.killed_at is not None:
            return self.killed_at
        return _status(self.pid, "VmHWM") - self.baseline


def kserve_v1_body(images: list[bytes]) -> dict:
    """requests.post keyword arguments of a KServe V1 predict request carrying ``images`` (base64)."""
    return {"json": {"instances": [{"image": {"b64": base64.b64encode(image).decode()}} for image in images]}}


def oip_v2_binary_body(images: list[bytes]) -> dict:
    """requests.post keyword arguments of an Open Inference Protocol V2 infer request carrying ``images`` as one
    BYTES tensor in the binary extension (each element a 4-byte little-endian length, then its bytes)."""
    tensor = b"".join(struct.pack("<I", len(image)) + image for image in images)
    head = {"inputs": [{"name": "image", "shape": [len(images)], "datatype": "BYTES"}]}
    head["inputs"][0]["parameters"] = {"binary_data_size": len(tensor)}
    text = json.dumps(head).encode()
    headers = {"Inference-Header-Content-Length": str(len(text)), "Content-Type": "application/octet-stream"}
    return {"data": text + tensor, "headers": headers}
