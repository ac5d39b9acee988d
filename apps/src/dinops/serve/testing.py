"""A small DINO checkpoint with random weights, and a real server process, for tests and benchmarks.

The model is tiny (ResNet-18, 64-d transformer, one encoder and one decoder layer, 20 queries) so that a
forward pass on a small image takes well under a second on a CPU; its detections are meaningless but
deterministic for a seed.
"""

from __future__ import annotations

import contextlib
import os
import socket
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
