"""Micro-batching: request threads submit single images; one thread runs them through the model in batches.

A batch starts with the oldest waiting image and takes whatever else arrives within ``max_wait_s`` up to
``max_batch`` images. The queue is bounded: when it is full :meth:`Batcher.submit` raises :class:`QueueFull`
at once (the API answers 503 with Retry-After) instead of letting memory grow without limit.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class QueueFull(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"queue full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass
class BatchInfo:
    size: int
    queue_s: float
    inference_s: float


@dataclass
class _Job:
    item: Any
    size: tuple[int, int]
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)


RunBatch = Callable[[Sequence[Any], Sequence[tuple[int, int]]], Sequence[Any]]
Observer = Callable[[int, float], None]  # (batch size, inference seconds)


class Batcher:
    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch: int = 8,
        max_wait_s: float = 0.01,
        queue_size: int = 64,
        observe: Observer | None = None,
    ) -> None:
        self.run_batch, self.max_batch, self.max_wait_s = run_batch, max_batch, max_wait_s
        self.observe = observe
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._batch_seconds = 0.05  # running average, for Retry-After
        self._thread = threading.Thread(target=self._loop, name="dino-batcher", daemon=True)
        self._thread.start()

    def depth(self) -> int:
        return self._queue.qsize()

    def submit(self, item: Any, size: tuple[int, int]) -> Future:
        """Queue one image; the future resolves to ``(result, BatchInfo)``."""
        job = _Job(item, size)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            batches_ahead = math.ceil(self._queue.maxsize / self.max_batch)
            raise QueueFull(max(1, math.ceil(batches_ahead * self._batch_seconds))) from None
        return job.future

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        jobs, deadline = [first], time.perf_counter() + self.max_wait_s
        while len(jobs) < self.max_batch:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
        return jobs, False

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            jobs, stop = self._collect(first)
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]  # drop requests that gave up
            if not jobs:
                continue
            started = time.perf_counter()
            try:
                results = self.run_batch([j.item for j in jobs], [j.size for j in jobs])
            except Exception as exc:
                log.exception("batch of %d failed", len(jobs))
                for job in jobs:
                    job.future.set_exception(exc)
                continue
            elapsed = time.perf_counter() - started
            self._batch_seconds = 0.8 * self._batch_seconds + 0.2 * elapsed
            if self.observe is not None:
                self.observe(len(jobs), elapsed)
            for job, result in zip(jobs, results, strict=True):
                job.future.set_result((result, BatchInfo(len(jobs), started - job.enqueued, elapsed)))
