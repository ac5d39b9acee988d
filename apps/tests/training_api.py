"""A real `dinops serve` (gunicorn on 127.0.0.1) waiting for a training run's checkpoint in an output folder, and its
``GET /v1/training`` answer: shared by the API's tests of that report (serve/test_training.py) and the data gate's
(train/test_progress_gate.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import requests

from dinops.serve.testing import free_port, running

TOKEN = "training-test-token"


@contextlib.contextmanager
def waiting_server(out: Path, **env: str) -> Iterator[str]:
    """`dinops serve` on a free port, waiting for ``out/checkpoint.pth`` and reading ``out/progress.json``, with the
    bearer token TOKEN and any other ``DINO_*`` settings given; yields its URL. The log is ``out/serve.log``."""
    port = free_port()
    settings = {
        "DINO_CHECKPOINT": str(out / "checkpoint.pth"),
        "DINO_WAIT_FOR_MODEL": "true",
        "DINO_MODEL_POLL_S": "0.2",
        "DINO_API_TOKEN": TOKEN,
        **env,
        "DINO_BIND": f"127.0.0.1:{port}",
    }
    url = f"http://127.0.0.1:{port}"
    with running("serve", settings, url, out / "serve.log", ready="/healthz"):
        yield url


def training(url: str) -> dict:
    """The server's ``GET /v1/training`` answer, asked with the token; a 200 with JSON, or the test fails."""
    answer = requests.get(url + "/v1/training", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"] == "application/json"
    return answer.json()
