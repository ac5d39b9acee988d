from __future__ import annotations

import os

import pytest

from dinops.data.synth import SynthSpec, generate


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: long-running proofs (the learning proof); CI runs them, `-m 'not slow'` skips them"
    )


@pytest.fixture(scope="session")
def small_synth(tmp_path_factory):
    """Synthetic shapes for evaluation and settings tests."""
    return generate(
        SynthSpec(train_images=8, val_images=6, image_size=64, categories=3, seed=11), tmp_path_factory.mktemp("synth")
    )


TINY_MODEL = (
    "hidden_dim=32,nheads=2,num_queries=10,enc_layers=1,dec_layers=1,dim_feedforward=64,dn_number=4,num_select=10"
)


def tiny_train_args(data_root, output_dir, *extra: str) -> list[str]:
    """Flags for a seconds-long deterministic CPU run on 64-pixel images."""
    return [
        "--data-root", str(data_root), "--output-dir", str(output_dir),
        "--model", "tiny", "--model-overrides", TINY_MODEL,
        "--train-scales", "56,64", "--crop-scales", "64", "--crop-size", "40,64",
        "--max-size", "64", "--eval-size", "64",
        "--batch-size", "2", "--num-workers", "0", "--device", "cpu", "--deterministic", "true", "--print-freq", "1",
        "--tensorboard", "false", "--lr", "2e-4",
        "--lr-backbone", "0",  # a frozen backbone halves the time per step
        "--metrics-port", "0",  # parallel runs must not race for 9109; the metrics tests pass their own port
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def train_synth(tmp_path_factory):
    """16 training images (8 steps of 2) and 4 validation images of 64 pixels."""
    return generate(
        SynthSpec(train_images=16, val_images=4, image_size=64, categories=3, seed=5),
        tmp_path_factory.mktemp("train_synth"),
    )


@pytest.fixture
def no_dino_env(monkeypatch):
    """In-process commands read DINO_* variables; the machine running the tests must not leak any in."""
    for name in [k for k in os.environ if k.startswith("DINO_")]:
        monkeypatch.delenv(name)
