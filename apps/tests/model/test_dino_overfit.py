"""A tiny detector overfits one batch: the whole training path (denoising, matcher, losses, backward) learns."""

from __future__ import annotations

from collections.abc import Callable

import torch

from dinops.model import DINOConfig, build_criterion, build_dino, pad_images, postprocess
from dinops.model.criterion import weighted_total


def test_one_batch_overfit(tiny_config: Callable[..., DINOConfig]) -> None:
    torch.manual_seed(0)
    cfg = tiny_config(num_queries=8, dec_layers=2)
    model = build_dino(cfg).train()
    criterion = build_criterion(cfg)
    images, mask = pad_images([torch.rand(3, 48, 48), torch.rand(3, 40, 48)])
    targets = [
        {"labels": torch.tensor([1, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.3, 0.4], [0.7, 0.6, 0.3, 0.3]])},
        {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.5, 0.5, 0.5, 0.5]])},
    ]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=1e-4)
    history, box_history = [], []
    for _ in range(40):
        losses = criterion(model(images, mask, targets=targets), targets)
        total = weighted_total(losses, criterion.weight_dict)
        assert torch.isfinite(total)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        history.append(total.item())
        box_history.append(losses["loss_bbox"].item())
    assert min(history[-5:]) < 0.4 * history[0], history
    assert min(box_history[-5:]) < 0.5 * box_history[0], box_history
    model.eval()
    with torch.no_grad():
        detections = postprocess(model(images, mask), torch.tensor([[48, 48], [40, 48]]), num_select=3)
    assert [len(d["scores"]) for d in detections] == [3, 3]
