"""What one worker holds at once: the bytes of the images in flight (DINO_MAX_DECODED_MB) and the decodes running at
the same time (DINO_DECODE_THREADS).

A request reserves, all at once and before it decodes anything, the most its images can hold together (as
:func:`request_bytes` computes from their headers), and gives the reservation back when it has its answer. Reserving
all or nothing means that no request holds part of the budget while it waits for the rest, so requests cannot
deadlock each other; the wait is bounded by the request's deadline, after which the caller answers 429.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence

from dinops.serve.images import Pending


def request_bytes(pending: Sequence[Pending]) -> int:
    """The most a request's images hold at any moment when they are decoded one after another: the arrays already
    decoded plus the one being decoded (its whole cost, less its own array, already counted)."""
    if not pending:
        return 0
    return sum(p.held for p in pending) + max(p.cost - p.held for p in pending)


class InFlight:
    """A byte budget and a decode semaphore, shared by the request threads of one worker."""

    def __init__(self, capacity_bytes: int, decode_threads: int) -> None:
        self.capacity = capacity_bytes
        self.decode_threads = decode_threads
        self.in_use = 0
        self._room = threading.Condition()
        self._decoders = threading.BoundedSemaphore(decode_threads)

    def reserve(self, nbytes: int, deadline: float) -> bool:
        """Take ``nbytes`` of the budget, waiting until ``deadline`` (``time.monotonic()``) at most; False if there
        was no room by then. ``nbytes`` over the whole capacity is the caller's to refuse before."""
        with self._room:
            fits = self._room.wait_for(
                lambda: self.in_use + nbytes <= self.capacity, timeout=max(0.0, deadline - time.monotonic())
            )
            if fits:
                self.in_use += nbytes
            return fits

    def release(self, nbytes: int) -> None:
        with self._room:
            self.in_use -= nbytes
            self._room.notify_all()

    @contextlib.contextmanager
    def decoding(self, deadline: float) -> Iterator[bool]:
        """A decode slot; yields False (holding none) if none was free by ``deadline``."""
        acquired = self._decoders.acquire(timeout=max(0.0, deadline - time.monotonic()))
        try:
            yield acquired
        finally:
            if acquired:
                self._decoders.release()
