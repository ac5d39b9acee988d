from __future__ import annotations

import pytest

from dinops.data.loader import ResumableBatchSampler


def test_ranks_interleave_into_the_single_process_batches():
    single = list(ResumableBatchSampler(10, 4, seed=1))
    ranks = [list(ResumableBatchSampler(10, 2, num_replicas=2, rank=r, seed=1)) for r in range(2)]
    assert len(single) == 2
    for k, batch in enumerate(single):
        assert sorted(batch) == sorted(ranks[0][k] + ranks[1][k])
    assert sorted(i for b in single for i in b) == sorted(set(i for b in single for i in b))


def test_start_batch_skips_exactly_the_done_batches():
    s = ResumableBatchSampler(20, 3, seed=4)
    s.set_epoch(2)
    full = list(s)
    s.set_epoch(2, start_batch=4)
    assert list(s) == full[4:] and len(s) == len(full) - 4
    s.set_epoch(3)
    assert list(s) != full


def test_eval_mode_covers_every_image_once():
    parts = [
        list(ResumableBatchSampler(7, 2, num_replicas=3, rank=r, shuffle=False, drop_last=False)) for r in range(3)
    ]
    assert sorted(i for p in parts for b in p for i in b) == list(range(7))


def test_too_small_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one global batch"):
        ResumableBatchSampler(3, 2, num_replicas=2)
