"""The micro-batcher groups what waits, respects its bounds, and survives failures."""

from __future__ import annotations

import threading
import time

import pytest

from dinops.serve.batching import Batcher, QueueFull


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.fail_on: int | None = None
        self.entered = 0

    def __call__(self, items, sizes):
        self.entered += 1
        self.gate.wait(10)
        self.batches.append(list(items))
        if self.fail_on in items:
            raise ValueError("model exploded")
        return [item * 10 for item in items]


def _until(condition) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.002)


@pytest.fixture
def recorder():
    return Recorder()


def test_waiting_jobs_are_grouped_up_to_max_batch(recorder):
    observed: list[int] = []
    batcher = Batcher(recorder, max_batch=4, max_wait_s=0.05, queue_size=16, observe=lambda n, s: observed.append(n))
    first = batcher.submit(0, (1, 1))
    _until(lambda: recorder.entered == 1)  # in flight, held at the gate
    rest = [batcher.submit(i, (1, 1)) for i in range(1, 10)]
    recorder.gate.set()
    results = [f.result(10) for f in [first, *rest]]
    batcher.close()
    assert [r for r, _ in results] == [i * 10 for i in range(10)]
    assert recorder.batches == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]
    assert observed == [1, 4, 4, 1]
    assert [info.size for _, info in results] == [1, 4, 4, 4, 4, 4, 4, 4, 4, 1]


def test_lone_job_waits_at_most_max_wait(recorder):
    recorder.gate.set()
    batcher = Batcher(recorder, max_batch=8, max_wait_s=0.02, queue_size=4)
    started = time.perf_counter()
    assert batcher.submit(7, (1, 1)).result(5)[0] == 70
    assert time.perf_counter() - started < 1.0
    batcher.close()


def test_full_queue_raises_with_retry_hint(recorder):
    batcher = Batcher(recorder, max_batch=1, max_wait_s=0, queue_size=2)
    batcher.submit(0, (1, 1))
    _until(lambda: recorder.entered == 1)
    batcher.submit(1, (1, 1))
    batcher.submit(2, (1, 1))
    with pytest.raises(QueueFull) as caught:
        batcher.submit(3, (1, 1))
    assert caught.value.retry_after_s >= 1
    recorder.gate.set()
    batcher.close()


def test_failed_batch_fails_its_jobs_only(recorder):
    recorder.fail_on = 1
    recorder.gate.set()
    batcher = Batcher(recorder, max_batch=1, max_wait_s=0, queue_size=4)
    with pytest.raises(ValueError, match="exploded"):
        batcher.submit(1, (1, 1)).result(5)
    assert batcher.submit(2, (1, 1)).result(5)[0] == 20
    batcher.close()


def test_cancelled_jobs_are_skipped(recorder):
    batcher = Batcher(recorder, max_batch=8, max_wait_s=0, queue_size=8)
    held = batcher.submit(0, (1, 1))
    _until(lambda: recorder.entered == 1)
    abandoned = batcher.submit(1, (1, 1))
    kept = batcher.submit(2, (1, 1))
    assert abandoned.cancel()
    recorder.gate.set()
    assert held.result(5)[0] == 0 and kept.result(5)[0] == 20
    batcher.close()
    assert recorder.batches == [[0], [2]]
