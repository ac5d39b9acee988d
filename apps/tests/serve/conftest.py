"""Fixtures for the inference API: images of every kind, a fake DINO with known outputs, app and client."""

from __future__ import annotations

import io
import os
import struct
import zlib

import pytest
import torch
from PIL import Image

from dinops.serve.app import create_app
from dinops.serve.detector import Detector

# Query i predicts class LABELS[i] with probability SCORES[i] at BOXES[i] (normalised cx, cy, w, h).
BOXES = [(0.5, 0.5, 0.5, 0.5), (0.25, 0.25, 0.1, 0.2), (0.8, 0.7, 0.2, 0.2)]
LABELS = [18, 1, 12]  # dog, person, and 12: one of COCO's unnamed ids
SCORES = [0.9, 0.6, 0.2]


class FakeDINO(torch.nn.Module):
    """Honours the model's tensor contract; every image gets the same queries. Records batch shapes."""

    def __init__(self, num_classes: int = 91) -> None:
        super().__init__()
        logits = torch.full((len(BOXES), num_classes), -20.0)
        for q, (label, score) in enumerate(zip(LABELS, SCORES, strict=True)):
            logits[q, label] = torch.logit(torch.tensor(score))
        self.register_buffer("logits", logits)
        self.register_buffer("boxes", torch.tensor(BOXES))
        self.calls: list[tuple[int, ...]] = []
        self.gate = None  # a threading.Event the forward waits for, to hold a batch in flight
        self.entered = 0  # forward calls started (calls lists those finished)

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        assert (
            images.dtype == torch.float32
            and mask.dtype == torch.bool
            and mask.shape == images.shape[:1] + images.shape[2:]
        )
        self.entered += 1
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append(tuple(images.shape))
        b = images.shape[0]
        return {"pred_logits": self.logits.expand(b, -1, -1), "pred_boxes": self.boxes.expand(b, -1, -1)}


def make_detector(model: torch.nn.Module | None = None) -> Detector:
    from dinops import model as dino_model

    return Detector(
        model=model or FakeDINO(),
        postprocess=dino_model.postprocess,
        pad_images=dino_model.pad_images,
        min_size=64,
        max_size=128,
        num_select=10,
        info={"checkpoint": "fake", "backend": "pytorch"},
    )


# The fake model runs on the CPU: batching as on a GPU (CPU_BATCH_MAX_SIZE defaults to 1, batching off).
BASE_CONFIG = {"TESTING": True, "THRESHOLD": 0.3, "BATCH_MAX_WAIT_MS": 1.0, "WARMUP": True, "CPU_BATCH_MAX_SIZE": 64}


@pytest.fixture
def make_app():
    apps = []

    def _make(**overrides):
        config = {**BASE_CONFIG, "DETECTOR": make_detector(), **overrides}
        app = create_app(config)
        apps.append(app)
        if overrides.get("START", True):
            runtime = app.extensions["dino"]
            runtime.start()
            assert runtime.wait(30), runtime.error
        return app

    yield _make
    for app in apps:
        app.extensions["dino"].close()


@pytest.fixture
def app(make_app):
    return make_app()


@pytest.fixture
def client(app):
    return app.test_client()


def _encode(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _png_with_size(width: int, height: int) -> bytes:
    """A tiny valid-looking PNG whose header claims ``width`` x ``height`` (for bombs and zero sizes)."""
    data = bytearray(_encode(Image.new("L", (1, 1))))
    ihdr = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


@pytest.fixture(scope="session")
def encode():
    """``encode(image, fmt="PNG", **save_kwargs) -> bytes``"""
    return _encode


@pytest.fixture(scope="session")
def png_with_size():
    return _png_with_size


@pytest.fixture(scope="session")
def fake_answer():
    """What FakeDINO predicts: lists of normalised cxcywh boxes, labels and scores, query by query."""
    return {"boxes": BOXES, "labels": LABELS, "scores": SCORES}


@pytest.fixture
def fake_model():
    """A fresh FakeDINO and a detector around it: ``model, detector = fake_model()``."""

    def _make():
        model = FakeDINO()
        return model, make_detector(model)

    return _make


def replace_file(path, text: str) -> None:
    """As training writes a checkpoint: a whole new file renamed over the old one, never a half-written file that a
    watching runtime could load (a plain write_text raced it on a loaded machine: CI, 2026-11-27, test_waiting)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
