from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dinops.train import checkpoints


def test_atomic_save_replaces_whole_files(tmp_path):
    path = tmp_path / checkpoints.LATEST
    checkpoints.save_atomic({"epoch": 1, "w": torch.ones(3)}, path)
    checkpoints.save_atomic({"epoch": 2, "w": torch.zeros(3)}, path)
    assert checkpoints.load(path)["epoch"] == 2
    assert [p.name for p in tmp_path.iterdir()] == [checkpoints.LATEST]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / checkpoints.LATEST
    checkpoints.save_atomic({"epoch": 1}, path)

    def broken_save(obj, fh):
        fh.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoints.save_atomic({"epoch": 2}, path)
    monkeypatch.undo()
    assert checkpoints.load(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [checkpoints.LATEST]


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.pth"
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(RuntimeError, match="cannot be read"):
        checkpoints.load(path)


def test_resume_path(tmp_path):
    assert checkpoints.resume_path("", tmp_path) is None
    assert checkpoints.resume_path("auto", tmp_path) is None  # nothing yet: a fresh start
    checkpoints.save_atomic({}, tmp_path / checkpoints.LATEST)
    assert checkpoints.resume_path("auto", tmp_path) == tmp_path / checkpoints.LATEST
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        checkpoints.resume_path(str(tmp_path / "nope.pth"), tmp_path)


def test_keep_copy_survives_later_replacement(tmp_path):
    latest = tmp_path / checkpoints.LATEST
    checkpoints.save_atomic({"epoch": 0}, latest)
    kept = checkpoints.keep_copy(latest, tmp_path / checkpoints.numbered(0))
    checkpoints.save_atomic({"epoch": 1}, latest)
    assert kept.name == "checkpoint0000.pth" and checkpoints.load(kept)["epoch"] == 0


def test_rng_state_round_trip():
    state = checkpoints.rng_state()
    expected = (torch.rand(2), np.random.rand(), random.random())
    torch.rand(5)
    checkpoints.set_rng_state(state)
    assert (
        torch.equal(torch.rand(2), expected[0]) and np.random.rand() == expected[1] and random.random() == expected[2]
    )
