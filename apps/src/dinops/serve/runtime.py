"""The model attached to the app once per process: an ``init_app``-style extension.

Loading starts on the first request or when gunicorn's worker has been forked (never in the master, so CUDA
is first touched in the process that uses it), runs in a background thread, and ends with a warm-up
forward; ``/readyz`` answers 200 only after that. Tests pass a ready-made :class:`Detector` (``DETECTOR`` in
the test config) or a loader (``DETECTOR_LOADER``).

With ``WAIT_FOR_MODEL`` (``DINO_WAIT_FOR_MODEL``), a checkpoint that does not exist yet is not an error: the
runtime reports ``waiting`` and a background thread looks for the file every ``MODEL_POLL_S`` seconds, then loads
and warms it up, exactly as at start. A file that fails to load (``failed``) is tried again when it changes (a
training run may write a new one); a file that disappears before any model was loaded means ``waiting`` again.

Following a training run (``RELOAD``, ``DINO_RELOAD``; ``auto``, the default, is on exactly with
``WAIT_FOR_MODEL``): after the first load the same thread keeps looking at the file. Its identity is (inode, size,
mtime in ns): training replaces the file by a rename, which gives it a new inode even where size and mtime happen to
be equal. When the identity changed, the new file is loaded and warmed up in that thread while the loaded model keeps
answering, then swapped in by one reference assignment. Each batch takes the detector once, so a batch that has
started finishes on the old model and the next one runs on the new. A reload that fails keeps the loaded model and
the ``ready`` state and reports ``reload.error`` on /healthz until a later file loads; a file that disappears keeps
the loaded model too. Off (an explicit checkpoint without ``WAIT_FOR_MODEL``): a released model changes only through
a roll-out, never under one replica's feet.

A checkpoint in S3 (``CHECKPOINT`` ``s3://bucket/key.pth``, or ``s3://bucket/prefix/``: the checkpoint that the
prefix's ``latest.json`` manifest names, see :mod:`dinops.train.s3_output`) is handled the same way: its identity
is the object's ETag, size and sha256 metadata (the manifest's key, size and sha256 for a prefix); a missing object
or manifest means ``waiting``. Before each load the object is downloaded into ``S3_CACHE_DIR`` (a ``.part`` file
renamed into place once its size and sha256 match), and this worker's previous download is deleted after the swap.
An S3 error while looking (unreachable endpoint, wrong credentials) is reported like a failed load and looked at
again at the next poll.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask

from dinops import s3
from dinops.serve.batching import Batcher
from dinops.serve.detector import Detector, Prediction, load_detector
from dinops.serve.metrics import Metrics
from dinops.serve.s3_checkpoint import ObjectIdentity, S3Checkpoint
from dinops.serve.threads import torch_threads

log = logging.getLogger(__name__)

MODEL_STATES = ("waiting", "loading", "ready", "failed")  # as /healthz reports them ("model")


@dataclass(frozen=True)
class FileIdentity:
    """What tells one checkpoint file from the next at the same path (``os.stat``)."""

    inode: int
    size: int
    mtime_ns: int

    def describe(self) -> dict[str, object]:
        seconds, ns = divmod(self.mtime_ns, 1_000_000_000)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns // 1_000_000:03d}Z"
        return {"mtime": stamp, "mtime_ns": self.mtime_ns, "size": self.size, "inode": self.inode}


def file_identity(path: Path) -> FileIdentity | None:
    """The identity of a regular file; None when there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return FileIdentity(stat.st_ino, stat.st_size, stat.st_mtime_ns) if path.is_file() else None


class LocalCheckpoint:
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def identity(self) -> FileIdentity | None:
        return file_identity(self.path)

    def fetch(self, identity: Any) -> Path:
        return self.path

    def loaded(self, path: Path) -> None:
        pass


def checkpoint_source(config: Any) -> LocalCheckpoint | S3Checkpoint:
    checkpoint = str(config.get("CHECKPOINT") or "")
    if s3.is_s3_url(checkpoint):
        return S3Checkpoint(checkpoint, config.get("S3_ENDPOINT") or "", config.get("S3_CACHE_DIR") or "")
    return LocalCheckpoint(checkpoint)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ModelRuntime:
    def __init__(self, app: Flask | None = None) -> None:
        self.state = "idle"  # idle -> loading -> ready | failed; waiting for a model: idle -> waiting <-> loading...
        self.error = ""
        self.detector: Detector | None = None  # replaced whole by a reload; read it once per use
        self.batcher: Batcher | None = None
        self.warmup_s: float | None = None
        self.loaded: dict[str, Any] | None = None  # the model in use, as /healthz reports it
        self.reload_error = ""
        self.reloads = 0
        self._lock = threading.Lock()
        # What /healthz reports (state, error, loaded, reloads, reload_error) changes under this lock and is read under
        # it (health_view): a reader never sees the new model's description with the old reload count (CI,
        # 2026-11-27: global_step 16 with reloads 0, read between two of these writes on a loaded machine).
        self._published = threading.Lock()
        self._done = threading.Event()
        self._closed = threading.Event()
        self.waits_for_model = False
        self.follows = False
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
        self.source = checkpoint_source(app.config) if app.config.get("DETECTOR") is None else None
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

    def health_view(self) -> tuple[str, str, dict[str, Any] | None, int, str]:
        """(model_state, error, loaded, reloads, reload_error), all from one moment (see ``_published``)."""
        with self._published:
            return self.model_state, self.error, self.loaded, self.reloads, self.reload_error

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
            from_file = bool(self.checkpoint) and self.config.get("DETECTOR") is None
            self.waits_for_model = bool(self.config.get("WAIT_FOR_MODEL")) and from_file
            reload = str(self.config.get("RELOAD", "auto")).lower()
            self.follows = from_file and (reload == "true" or (reload == "auto" and self.waits_for_model))
            try:
                missing = self.source is None or self.source.identity() is None
            except s3.S3Error:  # the loader thread reports it
                missing = False
            self.state = "waiting" if self.waits_for_model and missing else "loading"
        target = self._watch if self.waits_for_model or self.follows else self._load
        threading.Thread(target=target, name="dino-loader", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout) and self.state == "ready"

    def _load(self) -> None:
        try:
            self._load_once()
        finally:
            self._done.set()

    def _watch(self) -> None:
        """Wait for the checkpoint and load it; after a failed load, try again when the file changes; with
        ``follows``, keep loading each new file (see the module docstring)."""
        path = self.checkpoint
        tried: FileIdentity | ObjectIdentity | None = None  # the file last loaded or failed: not tried again until
        announced = False  # it changes
        while not self._closed.is_set():
            try:
                identity = self.source.identity()
            except s3.S3Error as exc:
                self._report_lookup_failure(exc)
                self._closed.wait(self.poll_s)
                continue
            if self.detector is None:
                if identity is None:
                    tried = None
                    if self.state != "waiting":
                        with self._published:
                            self.state, self.error = "waiting", ""
                        announced = False
                    if not announced:
                        log.warning("%s (polling every %g s)", self.waiting_message, self.poll_s)
                        announced = True
                elif identity != tried:
                    tried = identity
                    log.info("checkpoint %s is there; loading it", path)
                    with self._published:
                        self.state, self.error = "loading", ""
                    if self._load_once(identity):
                        self._done.set()
                        if not self.follows:
                            return
                    else:
                        log.warning("will try %s again when it changes", path)
            elif identity is not None and identity != tried:
                tried = identity
                log.info("checkpoint %s was replaced; loading the new one beside the model in use", path)
                self._load_once(identity)
            self._closed.wait(self.poll_s)

    def _report_lookup_failure(self, exc: Exception) -> None:
        if self.detector is None:
            if self.error != str(exc):
                log.error("cannot look at %s: %s", self.checkpoint, exc)
            with self._published:
                self.state, self.error = "failed", str(exc)
        else:
            if self.reload_error != str(exc):
                log.error("cannot look at %s (still serving the loaded model): %s", self.checkpoint, exc)
            with self._published:
                self.reload_error = str(exc)

    def _run_batch(self, images: Sequence[Any], sizes: Sequence[tuple[int, int]]) -> list[tuple[Prediction, Detector]]:
        """One batch on the detector in use when it starts; each result names the detector that computed it."""
        detector = self.detector
        return [(prediction, detector) for prediction in detector.forward(images, sizes)]

    def _load_once(self, identity: FileIdentity | None = None) -> bool:
        """Load, warm up and swap in a detector. The first load sets ``ready`` or ``failed``; a reload that fails
        keeps the loaded model and records ``reload_error``."""
        started = time.perf_counter()
        first = self.detector is None
        fetched: Path | None = None
        try:
            if identity is None and self.checkpoint and self.source is not None:
                identity = self.source.identity()
            if isinstance(self.source, S3Checkpoint) and identity is None:
                raise s3.S3Error(f"checkpoint {self.checkpoint} does not exist (DINO_CHECKPOINT)")
            if first:
                import torch

                threads, source = torch_threads(self.config["TORCH_THREADS"])
                torch.set_num_threads(threads)
                log.info("torch uses %d CPU threads (%s)", threads, source)
            config = dict(self.config)
            if isinstance(self.source, S3Checkpoint):
                fetched = self.source.fetch(identity)
                config["CHECKPOINT"] = str(fetched)
            detector = self._loader(config)
            if fetched is not None:  # the model's name is its S3 object, not the cache file
                detector.info = {**detector.info, "checkpoint": identity.url, "cache": str(fetched)}
            warmup_s = detector.warm_up() if self.config["WARMUP"] else None
            if self.batcher is None:
                self.batcher = Batcher(
                    self._run_batch,
                    max_batch=max_batch(self.config, detector.device),
                    max_wait_s=self.config["BATCH_MAX_WAIT_MS"] / 1000.0,
                    queue_size=self.config["QUEUE_SIZE"],
                    observe=self.metrics.observe_batch,
                )
        except Exception as exc:
            if fetched is not None:
                fetched.unlink(missing_ok=True)
            with self._published:
                if first:
                    self.error = str(exc)
                    self.state = "failed"
                else:
                    self.reload_error = str(exc)
                    self.metrics.reloads.labels("failed").inc()
            if first:
                log.exception("model failed to load")
            else:
                log.exception("reload failed; still serving %s", (self.loaded or {}).get("checkpoint"))
            return False
        self.warmup_s = warmup_s
        loaded = {
            "checkpoint": detector.info.get("checkpoint", self.checkpoint),
            **{k: detector.info[k] for k in ("epoch", "step", "global_step") if k in detector.info},
            **(identity.describe() if identity is not None else {}),
            "class_names": detector.info.get("class_names", detector.class_names.source),
            "loaded_at": _utc_now(),
        }
        if fetched is not None:  # the previous download goes (the model in use holds its weights in memory)
            self.source.loaded(fetched)
        with self._published:
            self.detector = detector  # the swap: batches that start from now on run on this model
            self.loaded = loaded
            self.reload_error = ""
            self.state = "ready"
            if not first:
                self.reloads += 1
                self.metrics.reloads.labels("ok").inc()
        log.info(
            "model ready" if first else "model reloaded",
            extra={
                "device": str(detector.device),
                "load_s": round(time.perf_counter() - started, 3),
                **detector.info,
                **{k: v for k, v in self.loaded.items() if k in ("epoch", "step", "global_step", "mtime")},
            },
        )
        return True

    def close(self) -> None:
        self._closed.set()
        if self.batcher is not None:
            self.batcher.close()


def max_batch(config: dict[str, Any], device: Any) -> int:
    """Images per forward pass: ``BATCH_MAX_SIZE`` on a GPU, at most ``CPU_BATCH_MAX_SIZE`` on a CPU.

    On the build machine's CPU a batch of 8 ran at 0.93x the images/s of one image at a time (the forward is
    compute-bound at batch 1 already) and the server at 0.89x (docs/api.md, "Speed"), so the CPU default is 1.
    """
    if getattr(device, "type", str(device)) == "cuda":
        return config["BATCH_MAX_SIZE"]
    return min(config["BATCH_MAX_SIZE"], config.get("CPU_BATCH_MAX_SIZE", 1))
