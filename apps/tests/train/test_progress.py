"""progress.json (dinops.train.progress): atomic replacement, the bounded loss curve, the ETA, write throttling."""

from __future__ import annotations

import json
import threading

import pytest

from dinops.train.progress import LossCurve, ProgressFile, eta_s, write_atomic


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _step(progress: ProgressFile, global_step: int, step_s: float = 0.5, loss: float = 1.0) -> None:
    progress.step(
        epoch=0,
        step=global_step,
        global_step=global_step,
        losses={"loss": loss, "loss_ce": loss / 2},
        learning_rate=1e-4,
        step_s=step_s,
        data_wait_s=step_s / 10,
    )


def test_a_reader_never_sees_half_a_file(tmp_path):
    path = tmp_path / "progress.json"
    big = {"state": "training", "loss_curve": [[i, i / 3] for i in range(2000)]}  # ~40 KB: several write() calls
    write_atomic(path, big)
    seen, errors, stop = [], [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                seen.append(len(json.loads(path.read_text())["loss_curve"]))
            except ValueError as exc:  # a torn file would be invalid JSON
                errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    for n in range(100):
        write_atomic(path, big | {"loss_curve": big["loss_curve"][: 2000 - n]})
    stop.set()
    reader.join()
    assert not errors and seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]  # no temporary file left behind


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "progress.json"
    write_atomic(path, {"state": "training", "global_step": 3})
    with pytest.raises(ValueError):
        write_atomic(path, {"state": "training", "loss": float("nan")})  # not JSON: refused before the rename
    assert json.loads(path.read_text()) == {"state": "training", "global_step": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]


@pytest.mark.parametrize("steps", [7, 500, 501, 10_000, 123_457])
def test_the_loss_curve_stays_bounded_and_evenly_spaced(steps):
    curve = LossCurve(max_points=500)
    for step in range(1, steps + 1):
        curve.add(step, float(step))
    points = curve.as_list()
    assert 2 <= len(points) <= 500 if steps > 1 else len(points) == 1
    assert points[-1] == [steps, float(steps)]  # it ends at the latest step
    xs = [x for x, _ in points]
    assert xs == sorted(set(xs))
    gaps = {b - a for a, b in zip(xs[:-1], xs[1:], strict=True)}
    assert max(gaps) <= curve.stride and xs[0] <= curve.stride  # the whole run is covered, with no wide hole
    if steps > 1000:
        assert len(points) >= 250  # thinned to at most half, never to a handful


def test_eta_is_the_remaining_steps_at_the_measured_step_time(tmp_path):
    clock = Clock()
    progress = ProgressFile(tmp_path, clock=clock, min_interval_s=0)
    progress.plan(epochs=2, steps_per_epoch=50, total_steps=100, images_per_step=8)
    assert eta_s(10, 100, None) is None
    for n in range(1, 21):
        _step(progress, n, step_s=0.5)
    doc = json.loads((tmp_path / "progress.json").read_text())
    assert doc["eta_s"] == pytest.approx(80 * 0.5)
    assert doc["images_per_s"] == pytest.approx(16.0)
    assert doc["step_s"] == pytest.approx(0.5) and doc["data_wait_s"] == pytest.approx(0.05)
    for n in range(21, 31):
        _step(progress, n, step_s=2.0)  # slower now: the ETA follows the measured time (mean of the last steps)
    doc = json.loads((tmp_path / "progress.json").read_text())
    assert doc["eta_s"] == pytest.approx(70 * (20 * 0.5 + 10 * 2.0) / 30)


def test_steps_are_written_every_few_seconds_and_state_changes_at_once(tmp_path):
    clock = Clock()
    progress = ProgressFile(tmp_path, clock=clock, min_interval_s=2.0)
    progress.plan(epochs=1, steps_per_epoch=100, total_steps=100, images_per_step=2)
    path = tmp_path / "progress.json"
    _step(progress, 1)
    assert json.loads(path.read_text())["global_step"] == 1  # the first step is written
    for n in range(2, 10):
        clock.now += 0.1
        _step(progress, n)
    assert json.loads(path.read_text())["global_step"] == 1  # 0.8 s later: not yet
    clock.now += 1.5
    _step(progress, 10)
    assert json.loads(path.read_text())["global_step"] == 10
    progress.set_state("evaluating")
    assert json.loads(path.read_text())["state"] == "evaluating"
    progress.evaluated(epoch=0, global_step=10, stats=[0.5, 0.75, 0.25])
    progress.checkpointed(path=tmp_path / "checkpoint.pth", epochs_done=1, global_step=10)
    progress.set_state("failed", "FloatingPointError: loss is nan")
    doc = json.loads(path.read_text())
    assert doc["state"] == "failed" and doc["reason"] == "FloatingPointError: loss is nan"
    assert doc["evaluations"] == [{"epoch": 0, "global_step": 10, "ap": 0.5, "ap50": 0.75, "ap75": 0.25}]
    assert doc["checkpoint"]["path"] == str(tmp_path / "checkpoint.pth") and doc["checkpoint"]["global_step"] == 10
    assert doc["loss_curve"][-1] == [10, 1.0] and "eta_s" not in doc
    with pytest.raises(ValueError, match="unknown state"):
        progress.set_state("sleeping")


def test_a_resumed_run_keeps_the_history_up_to_its_checkpoint(tmp_path):
    first = ProgressFile(tmp_path, clock=Clock(), min_interval_s=0)
    first.plan(epochs=2, steps_per_epoch=8, total_steps=16, images_per_step=2)
    for n in range(1, 9):
        _step(first, n, loss=20.0 - n)
    first.evaluated(epoch=0, global_step=8, stats=[0.1, 0.2, 0.05])
    for n in range(9, 12):
        _step(first, n, loss=20.0 - n)
    first.checkpointed(path=tmp_path / "checkpoint.pth", epochs_done=1, global_step=8)
    first.set_state("stopped", "exit status 143")  # evicted at step 11; the checkpoint holds step 8

    second = ProgressFile(tmp_path, clock=Clock(), min_interval_s=0)
    second.write()  # as the monitor does at start: the old file is replaced, its history was read before
    second.resume(8)
    doc = json.loads((tmp_path / "progress.json").read_text())
    assert doc["state"] == "waiting_for_data"
    assert doc["loss_curve"] == [[n, 20.0 - n] for n in range(1, 9)]  # steps 9-11 are redone, not kept twice
    assert doc["evaluations"] == [{"epoch": 0, "global_step": 8, "ap": 0.1, "ap50": 0.2, "ap75": 0.05}]
    _step(second, 9, loss=5.0)
    assert json.loads((tmp_path / "progress.json").read_text())["loss_curve"][-1] == [9, 5.0]

    (tmp_path / "progress.json").write_text("not json")  # a broken file is no history, and no reason not to start
    third = ProgressFile(tmp_path, clock=Clock(), min_interval_s=0)
    third.resume(8)
    assert json.loads((tmp_path / "progress.json").read_text())["loss_curve"] == []
