"""Hungarian matcher: batched equals per image, obvious assignments, empty targets."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dinops.model.matcher import HungarianMatcher


@pytest.fixture
def make_outputs(random_cxcywh: Callable[..., torch.Tensor]) -> Callable[..., dict[str, torch.Tensor]]:
    def make(batch: int, queries: int, classes: int, seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        boxes = random_cxcywh(batch * queries, seed=seed).view(batch, queries, 4)
        return {"pred_logits": torch.randn(batch, queries, classes, generator=gen), "pred_boxes": boxes}

    return make


@pytest.fixture
def make_targets(random_cxcywh: Callable[..., torch.Tensor]) -> Callable[..., list[dict[str, torch.Tensor]]]:
    def make(counts: list[int], classes: int, seed: int) -> list[dict[str, torch.Tensor]]:
        gen = torch.Generator().manual_seed(seed)
        return [
            {"labels": torch.randint(0, classes, (n,), generator=gen), "boxes": random_cxcywh(n, seed=seed + i + 100)}
            for i, n in enumerate(counts)
        ]

    return make


def test_batched_equals_single_image(make_outputs, make_targets) -> None:
    matcher = HungarianMatcher()
    outputs = make_outputs(3, 15, 6, seed=3)
    targets = make_targets([4, 0, 7], 6, seed=4)
    batched = matcher(outputs, targets)
    for i, target in enumerate(targets):
        single = matcher({k: v[i : i + 1] for k, v in outputs.items()}, [target])[0]
        assert torch.equal(batched[i][0], single[0])
        assert torch.equal(batched[i][1], single[1])
    assert [len(src) for src, _ in batched] == [4, 0, 7]
    assert all(src.dtype == torch.int64 and tgt.dtype == torch.int64 for src, tgt in batched)


def test_exact_predictions_are_matched_to_their_targets(random_cxcywh) -> None:
    boxes = random_cxcywh(5, seed=7)
    labels = torch.tensor([0, 1, 2, 1, 0])
    order = torch.tensor([3, 0, 4, 1, 2])  # query q predicts target order[q]
    logits = torch.full((1, 5, 3), -8.0)
    logits[0, torch.arange(5), labels[order]] = 8.0
    outputs = {"pred_logits": logits, "pred_boxes": boxes[order][None]}
    src, tgt = HungarianMatcher()(outputs, [{"labels": labels, "boxes": boxes}])[0]
    assert torch.equal(tgt[src.argsort()], order)


def test_no_targets_in_the_whole_batch(make_outputs, make_targets) -> None:
    result = HungarianMatcher()(make_outputs(2, 4, 3, seed=0), make_targets([0, 0], 3, seed=0))
    assert [(len(s), len(t)) for s, t in result] == [(0, 0), (0, 0)]
