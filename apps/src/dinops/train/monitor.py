"""What `dinops train` tells the outside while it runs: ``progress.json`` (:mod:`dinops.train.progress`) and the
Prometheus metrics (:mod:`dinops.train.metrics`), both from process 0 only; the other processes get a monitor that
does nothing. ``--eval`` runs get one too: they must not overwrite the progress of the training run whose output
folder they may share.

A metrics port that cannot be bound (taken by another run on the host) is logged and training goes on without
metrics: they are an observer, never a reason to lose a run.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from dinops.train.engine import StepState, StepTiming
from dinops.train.metrics import MetricsServer, TrainMetrics
from dinops.train.progress import ProgressFile

log = logging.getLogger("dinops.train")


def gpu_stats(device: torch.device) -> dict[str, Any] | None:
    """Memory of ``device`` in bytes, and its utilisation when ``pynvml`` is installed; None off CUDA."""
    if device.type != "cuda":
        return None
    stats: dict[str, Any] = {
        "name": torch.cuda.get_device_name(device),
        "memory_allocated_bytes": torch.cuda.memory_allocated(device),
        "memory_reserved_bytes": torch.cuda.memory_reserved(device),
        "memory_total_bytes": torch.cuda.get_device_properties(device).total_memory,
    }
    try:
        stats["utilization_percent"] = torch.cuda.utilization(device)
    except Exception as exc:  # no pynvml (ModuleNotFoundError), or NVML refuses (pynvml.NVMLError, e.g. in a MIG slice)
        log.debug("no GPU utilisation: %s", exc)
    return stats


class Monitor:
    def __init__(self, output_dir: str | Path, metrics_port: int, active: bool) -> None:
        self.active = active
        self.device = torch.device("cpu")
        self.progress: ProgressFile | None = None
        self.metrics: TrainMetrics | None = None
        self.server: MetricsServer | None = None
        self.images_per_step = 0
        if not active:
            return
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        self.progress = ProgressFile(output_dir)
        self.metrics = TrainMetrics(output_dir)
        if metrics_port:
            try:
                self.server = MetricsServer(self.metrics, metrics_port)
                log.info("training metrics on port %d (/metrics)", self.server.port)
            except OSError as exc:
                log.warning("training metrics not served: port %d: %s", metrics_port, exc)
        self.progress.write()

    def plan(self, *, device: torch.device, epochs: int, steps_per_epoch: int, total_steps: int, global_batch: int):
        self.device, self.images_per_step = device, global_batch
        if self.active:
            self.progress.plan(
                epochs=epochs, steps_per_epoch=steps_per_epoch, total_steps=total_steps, images_per_step=global_batch
            )

    def resumed(self, global_step: int) -> None:
        if self.active:
            self.progress.resume(global_step)

    def state(self, state: str, reason: str | None = None, **position: int) -> None:
        if not self.active:
            return
        self.metrics.running.set(1 if state in ("training", "evaluating") else 0)
        self.metrics.evaluating.set(1 if state == "evaluating" else 0)
        if "epoch" in position:
            self.metrics.epoch.set(position["epoch"])
        self.progress.set_state(state, reason, **position)

    def step(self, state: StepState, values: dict[str, float], timing: StepTiming) -> None:
        """One optimizer step: ``values`` are the engine's console scalars (losses, ``class_error``, ``lr``)."""
        if not self.active:
            return
        losses = {k: v for k, v in values.items() if k.startswith("loss")}
        self.metrics.step(losses, values.get("lr", 0.0), timing.step_s, timing.data_wait_s)
        self.metrics.epoch.set(state.epoch)
        self.progress.step(
            epoch=state.epoch,
            step=state.step,
            global_step=state.global_step,
            losses=losses,
            learning_rate=values.get("lr", 0.0),
            step_s=timing.step_s,
            data_wait_s=timing.data_wait_s,
            gpu=lambda: gpu_stats(self.device),
        )
        self.metrics.images_per_second.set(self.progress.doc.get("images_per_s") or 0.0)

    def evaluated(self, epoch: int, global_step: int, stats: list[float]) -> None:
        if self.active:
            self.metrics.evaluated(stats)
            self.progress.evaluated(epoch=epoch, global_step=global_step, stats=stats)

    def checkpointed(self, path: str | Path, epochs_done: int, global_step: int) -> None:
        if self.active:
            self.metrics.last_checkpoint.set(time.time())
            self.progress.checkpointed(path=path, epochs_done=epochs_done, global_step=global_step)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
