"""The model attached to the app once per process: an ``init_app``-style extension.

Loading starts on the first request or when gunicorn's worker has been forked (never in the master, so CUDA
is first touched in the process that uses it), runs in a background thread, and ends with a warm-up
forward; ``/readyz`` answers 200 only after that. Tests pass a ready-made :class:`Detector` (``DETECTOR`` in
the test config) or a loader (``DETECTOR_LOADER``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from flask import Flask

from dinops.serve.batching import Batcher
from dinops.serve.detector import Detector, load_detector
from dinops.serve.metrics import Metrics

log = logging.getLogger(__name__)


class ModelRuntime:
    def __init__(self, app: Flask | None = None) -> None:
        self.state = "idle"  # idle -> loading -> ready | failed
        self.error = ""
        self.detector: Detector | None = None
        self.batcher: Batcher | None = None
        self.warmup_s: float | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        self.config = app.config
        self.metrics: Metrics = app.extensions["dino_metrics"]
        self.metrics.queue_depth.set_function(lambda: self.batcher.depth() if self.batcher else 0)
        self.metrics.ready.set_function(lambda: 1 if self.state == "ready" else 0)
        self._loader: Callable[[dict[str, Any]], Detector] = app.config.get("DETECTOR_LOADER") or load_detector
        if app.config.get("DETECTOR") is not None:
            injected = app.config["DETECTOR"]
            self._loader = lambda _config: injected
        app.extensions["dino"] = self

    def start(self) -> None:
        """Begin loading in the background (idempotent)."""
        with self._lock:
            if self.state != "idle":
                return
            self.state = "loading"
        threading.Thread(target=self._load, name="dino-loader", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout) and self.state == "ready"

    def _load(self) -> None:
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
        except Exception as exc:
            self.error = str(exc)
            self.state = "failed"
            log.exception("model failed to load")
        finally:
            self._done.set()

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
