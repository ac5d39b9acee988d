"""``OUTPUT_DIR/progress.json``: the training run's live state, for `dinops serve`'s ``GET /v1/training`` and the web
client's training panel.

The file is replaced atomically (a temporary file in the same folder, then a rename), so a reader sees the previous
or the new state, never half of one. It is rewritten at every state change, evaluation and checkpoint, and after a
step only when ``min_interval_s`` has passed since the last write: a fast run writes it every few seconds, not every
step. Only process 0 writes it (see :mod:`dinops.train.monitor`). A resumed run keeps the loss curve and the
evaluations of the file it finds, up to the step it resumes from (:meth:`ProgressFile.resume`).

Fields: ``state`` (``waiting_for_data``: datasets being read, first batches not there yet; ``training``;
``evaluating``; ``done``; ``stopped``: a signal stopped the run, ``--resume auto`` continues it; ``failed``, with
``reason``), ``epoch`` (0-based, the epoch in progress) of ``epochs``, ``step`` of ``steps_per_epoch``,
``global_step`` of ``total_steps``, ``step_s`` and ``data_wait_s`` (mean over the last steps), ``images_per_s``,
``eta_s`` (remaining steps times the measured step time; evaluations not included), ``learning_rate``, ``losses``
(the last step's terms), ``loss_curve`` (``[[global_step, loss], ...]``, at most ``max_points``, evenly thinned as
the run grows), ``evaluations`` (``[{"epoch", "global_step", "ap", "ap50", "ap75"}]``), ``checkpoint`` (the latest:
``path``, ``epochs_done``, ``global_step``, ``saved_at``), ``gpu`` (on CUDA: memory in bytes, and
``utilization_percent`` when ``pynvml`` is installed), ``started_at`` and ``updated_at`` (UTC, ISO 8601).

Before the trainer starts, the dataset gate (`dinops data-ready`, the training Job's init container; on the Docker
runtime a gate in front of the trainer in the same container) writes ``waiting_for_data`` with a ``reason`` here
(:func:`waiting_for_data`, run by :func:`data_ready`), so that the training panel says why nothing moves instead of
"not started"; the trainer then replaces or resumes the file as above.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dinops.data import ready

FILENAME = "progress.json"
STATES = ("waiting_for_data", "training", "evaluating", "done", "stopped", "failed")
WINDOW = 50  # steps the step time and throughput are averaged over


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class LossCurve:
    """At most ``max_points`` points of one value per step, evenly spaced over the whole run.

    Every ``stride``-th step is kept; when the list is full, every other point is dropped and the stride doubles,
    so the points stay evenly spaced and cover the run from its first step to its latest.
    """

    def __init__(self, max_points: int = 500) -> None:
        if max_points < 2:
            raise ValueError("a curve needs at least 2 points")
        self.max_points = max_points
        self.stride = 1
        self.points: list[tuple[int, float]] = []
        self.latest: tuple[int, float] | None = None

    def add(self, step: int, value: float) -> None:
        self.latest = (step, value)
        if step % self.stride:
            return
        self.points.append((step, value))
        if len(self.points) > self.max_points:
            self.stride *= 2
            self.points = [p for p in self.points if p[0] % self.stride == 0]

    def as_list(self) -> list[list[float]]:
        """The kept points, plus the latest step when the stride skipped it (so the curve ends where the run is)."""
        shown = list(self.points)
        if self.latest is not None and (not shown or shown[-1][0] != self.latest[0]):
            shown = shown[1:] if len(shown) == self.max_points else shown
            shown.append(self.latest)
        return [[step, round(value, 6)] for step, value in shown]


def remaining_steps(global_step: int, total_steps: int) -> int:
    return max(total_steps - global_step, 0)


def eta_s(global_step: int, total_steps: int, step_s: float | None) -> float | None:
    """Seconds left at the measured time per step; None before any step was measured."""
    if step_s is None:
        return None
    return remaining_steps(global_step, total_steps) * step_s


def read_document(path: Path) -> dict[str, Any] | None:
    """The progress document at ``path``; None when there is none or it cannot be used."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def write_atomic(path: Path, document: dict[str, Any]) -> None:
    # Host name and PID: the data gates of several training nodes may write one shared progress.json (TrainJob and
    # PyTorchJob on a shared volume), and their PIDs can be equal.
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(document, allow_nan=False))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class ProgressFile:
    """The run's state, written to ``output_dir/progress.json``; ``clock`` is wall time in seconds (tests set it)."""

    def __init__(
        self,
        output_dir: str | os.PathLike,
        *,
        min_interval_s: float = 2.0,
        max_points: int = 500,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(output_dir) / FILENAME
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.curve = LossCurve(max_points)
        self.step_times: deque[float] = deque(maxlen=WINDOW)
        self.wait_times: deque[float] = deque(maxlen=WINDOW)
        self.images_per_step = 0
        self.written_at: float | None = None
        self.previous = read_document(self.path)  # a run that stopped here; read before the first write replaces it
        self.doc: dict[str, Any] = {
            "state": "waiting_for_data",
            "started_at": utc(clock()),
            "epoch": 0,
            "epochs": None,
            "step": 0,
            "steps_per_epoch": None,
            "global_step": 0,
            "total_steps": None,
            "evaluations": [],
            "checkpoint": None,
        }

    def resume(self, global_step: int) -> None:
        """Carry over the previous file's loss curve and evaluations up to ``global_step`` (the checkpoint's)."""
        previous = self.previous or {}
        for point in previous.get("loss_curve", []):
            if isinstance(point, list) and len(point) == 2 and 0 < point[0] <= global_step:
                self.curve.add(int(point[0]), float(point[1]))
        evaluations = [e for e in previous.get("evaluations", []) if isinstance(e, dict)]
        self.doc["evaluations"] = [e for e in evaluations if e.get("global_step", global_step + 1) <= global_step]
        self.write()

    def plan(self, *, epochs: int, steps_per_epoch: int, total_steps: int, images_per_step: int) -> None:
        self.images_per_step = images_per_step
        self.doc.update(epochs=epochs, steps_per_epoch=steps_per_epoch, total_steps=total_steps)

    def set_state(self, state: str, reason: str | None = None, **position: int) -> None:
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}")
        self.doc.update(position, state=state)
        if reason is None:
            self.doc.pop("reason", None)
        else:
            self.doc["reason"] = reason
        if state in ("done", "stopped", "failed"):
            self.doc["eta_s"] = 0.0 if state == "done" else None
        self.write()

    def step(
        self,
        *,
        epoch: int,
        step: int,
        global_step: int,
        losses: dict[str, float],
        learning_rate: float,
        step_s: float,
        data_wait_s: float,
        gpu: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:
        """Record one optimizer step; write the file when ``min_interval_s`` has passed since the last write."""
        self.step_times.append(step_s)
        self.wait_times.append(data_wait_s)
        if "loss" in losses:
            self.curve.add(global_step, losses["loss"])
        mean_step = sum(self.step_times) / len(self.step_times)
        self.doc.update(
            epoch=epoch,
            step=step,
            global_step=global_step,
            losses={k: round(v, 6) for k, v in losses.items()},
            learning_rate=learning_rate,
            step_s=round(mean_step, 6),
            data_wait_s=round(sum(self.wait_times) / len(self.wait_times), 6),
            images_per_s=round(self.images_per_step / mean_step, 3) if mean_step > 0 else None,
            eta_s=eta_s(global_step, self.doc["total_steps"] or global_step, mean_step),
        )
        if self.written_at is None or self.clock() - self.written_at >= self.min_interval_s:
            self.doc["gpu"] = gpu()
            self.write()

    def evaluated(self, *, epoch: int, global_step: int, stats: list[float]) -> None:
        names = ("ap", "ap50", "ap75")
        self.doc["evaluations"].append(
            {"epoch": epoch, "global_step": global_step} | {n: round(v, 6) for n, v in zip(names, stats, strict=False)}
        )
        self.write()

    def checkpointed(self, *, path: str | os.PathLike, epochs_done: int, global_step: int) -> None:
        self.doc["checkpoint"] = {
            "path": str(path),
            "epochs_done": epochs_done,
            "global_step": global_step,
            "saved_at": utc(self.clock()),
        }
        self.write()

    def write(self) -> None:
        now = self.clock()
        self.doc["loss_curve"] = self.curve.as_list()
        self.doc["updated_at"] = utc(now)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, {k: v for k, v in self.doc.items() if v is not None or k == "checkpoint"})
        self.written_at = now


def waiting_for_data(output_dir: str | os.PathLike, reason: str, *, clock: Callable[[], float] = time.time) -> Path:
    """The dataset gate's word before training starts: state ``waiting_for_data`` and ``reason`` in
    ``output_dir/progress.json``, written atomically (:func:`write_atomic`); returns the file's path.

    A file of an earlier run (a pod retried after a restart, a resumed or finished run) keeps everything it holds, its
    loss curve, evaluations, checkpoint and position: only ``state``, ``reason`` and ``updated_at`` change, and the
    trainer, resuming, carries them on (:meth:`ProgressFile.resume`). Without one, the file a starting trainer writes,
    with the reason. The folder is never created: a gate without the output volume mounted must not write into its
    container's own filesystem. Raises OSError when the folder is not there or cannot be written."""
    folder = Path(output_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"the output folder {folder} is not there (is the output volume mounted here?)")
    path = folder / FILENAME
    previous = read_document(path)
    if previous is not None and previous.get("state") in STATES:
        write_atomic(path, previous | {"state": "waiting_for_data", "reason": reason, "updated_at": utc(clock())})
    else:
        ProgressFile(folder, clock=clock).set_state("waiting_for_data", reason)
    return path


def data_ready(argv: list[str] | None = None) -> int:
    """`dinops data-ready` that tells the training panel why it waits: the data package's gate
    (:func:`dinops.data.ready.main`) with :func:`waiting_for_data` as its writer. The data package stands below
    training and never imports it, so training hands the writer down."""
    return ready.main(argv, announce=waiting_for_data)
