"""The model attached to the app once per process: an ``init_app``-style extension.

Loading starts on the first request or when gunicorn's worker has been forked (never in the master, so CUDA
is first touched in the process that uses it), runs in a background thread, and ends with a warm-up
forward; ``/readyz`` answers 200 only after that. Tests pass a ready-made :class:`Detector` (``DETECTOR`` in
the test config) or a loader (``DETECTOR_LOADER``).

With ``WAIT_FOR_MODEL`` (``DINO_WAIT_FOR_MODEL``), a checkpoint that does not exist yet is not an error: the
runtime reports ``waiting`` and a background thread looks for the file every ``MODEL_POLL_S`` seconds, then loads
and warms it up once, exactly as at start. A file that fails to load (``failed``) is tried again when its size or
modification time changes (a training run may write a new one); a file that disappears means ``waiting`` again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask

from dinops.serve.batching import Batcher
from dinops.serve.detector import Detector, load_detector
from dinops.serve.metrics import Metrics

log = logging.getLogger(__name__)

MODEL_STATES = ("waiting", "loading", "ready", "failed")  # as /healthz reports them ("model")


def _signature(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, size) of a regular file; None when there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size) if path.is_file() else None


class ModelRuntime:
    def __init__(self, app: Flask | None = None) -> None:
        self.state = "idle"  # idle -> loading -> ready | failed; waiting for a model: idle -> waiting <-> loading...
        self.error = ""
        self.detector: Detector | None = None
        self.batcher: Batcher | None = None
        self.warmup_s: float | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._closed = threading.Event()
        self.waits_for_model = False
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        self.config = app.config
        self.metrics: Metrics = app.extensions["dino_metrics"]
        self.metrics.queue_depth.set_function(lambda: self.batcher.depth() if self.batcher else 0)
        self.metrics.ready.set_function(lambda: 1 if self.state == "ready" else 0)
        for name in MODEL_STATES:
            self.metrics.model_state.labels(name).set_function(lambda name=name: 1 if self.model_state == name else 0)
        self.checkpoint = str(app.config.get("CHECKPOINT") or "")
        self.poll_s = float(app.config.get("MODEL_POLL_S") or 5.0)
        self._loader: Callable[[dict[str, Any]], Detector] = app.config.get("DETECTOR_LOADER") or load_detector
        if app.config.get("DETECTOR") is not None:
            injected = app.config["DETECTOR"]
            self._loader = lambda _config: injected
        app.extensions["dino"] = self

    @property
    def model_state(self) -> str:
        """waiting, loading, ready or failed (not started yet counts as loading)."""
        return "loading" if self.state == "idle" else self.state

    @property
    def waiting_message(self) -> str:
        return f"waiting for a model: {self.checkpoint} does not exist yet; train, or give a checkpoint"

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.poll_s))

    def start(self) -> None:
        """Begin loading in the background (idempotent)."""
        with self._lock:
            if self.state != "idle":
                return
            self.waits_for_model = bool(
                self.config.get("WAIT_FOR_MODEL") and self.checkpoint and self.config.get("DETECTOR") is None
            )
            missing = _signature(Path(self.checkpoint)) is None
            self.state = "waiting" if self.waits_for_model and missing else "loading"
        target = self._watch if self.waits_for_model else self._load
        threading.Thread(target=target, name="dino-loader", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout) and self.state == "ready"

    def _load(self) -> None:
        try:
            self._load_once()
        finally:
            self._done.set()

    def _watch(self) -> None:
        """Wait for the checkpoint, load it once; after a failed load, try again when the file changes."""
        path = Path(self.checkpoint)
        tried: tuple[int, int] | None = None
        announced = False
        while not self._closed.is_set():
            signature = _signature(path)
            if signature is None:
                tried = None
                if self.state != "waiting":
                    self.state, self.error, announced = "waiting", "", False
                if not announced:
                    log.warning("%s (polling every %g s)", self.waiting_message, self.poll_s)
                    announced = True
            elif signature != tried:
                tried = signature
                log.info("checkpoint %s is there; loading it", path)
                self.state, self.error = "loading", ""
                if self._load_once():
                    self._done.set()
                    return
                log.warning("will try %s again when it changes", path)
            self._closed.wait(self.poll_s)

    def _load_once(self) -> bool:
        started = time.perf_counter()
        try:
            if self.config["TORCH_THREADS"] > 0:
                import torch

                torch.set_num_threads(self.config["TORCH_THREADS"])
            detector = self._loader(dict(self.config))
            if self.config["WARMUP"]:
                self.warmup_s = detector.warm_up()
            self.batcher = Batcher(
                detector.forward,
                max_batch=self.config["BATCH_MAX_SIZE"],
                max_wait_s=self.config["BATCH_MAX_WAIT_MS"] / 1000.0,
                queue_size=self.config["QUEUE_SIZE"],
                observe=self.metrics.observe_batch,
            )
            self.detector = detector
            self.state = "ready"
            log.info(
                "model ready",
                extra={
                    "device": str(detector.device),
                    "load_s": round(time.perf_counter() - started, 3),
                    **detector.info,
                },
            )
            return True
        except Exception as exc:
            self.error = str(exc)
            self.state = "failed"
            log.exception("model failed to load")
            return False

    def close(self) -> None:
        self._closed.set()
        if self.batcher is not None:
            self.batcher.close()
