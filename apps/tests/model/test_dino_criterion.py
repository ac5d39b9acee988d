"""Criterion: official weight_dict, loss keys, denoising layout rules, edge cases."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dinops.model import DINOConfig, build_criterion
from dinops.model.box_ops import box_cxcywh_to_xyxy
from dinops.model.criterion import sigmoid_focal_loss
from dinops.model.denoising import denoising_attn_mask, dn_group_count, prepare_for_cdn


def test_official_4scale_weight_dict() -> None:
    weights = build_criterion(DINOConfig.dino_4scale_r50()).weight_dict
    base = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    expected = dict(base) | {f"{k}_dn": v for k, v in base.items()}
    for i in range(5):
        expected |= {f"{k}_{i}": v for k, v in base.items()} | {f"{k}_dn_{i}": v for k, v in base.items()}
    expected |= {f"{k}_interm": v for k, v in base.items()}
    assert weights == expected


def test_interm_box_loss_switch() -> None:
    weights = build_criterion(DINOConfig(no_interm_box_loss=True, interm_loss_coef=0.5, use_dn=False)).weight_dict
    assert (weights["loss_ce_interm"], weights["loss_bbox_interm"], weights["loss_giou_interm"]) == (0.5, 0.0, 0.0)
    assert "loss_ce_dn" not in weights


def test_focal_loss_known_value() -> None:
    # Two queries: the mean runs over queries (dim 1), the sum over images and classes.
    logits = torch.tensor([[[0.0, 2.0], [0.0, 2.0]]])
    targets = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    p = torch.sigmoid(torch.tensor(2.0))
    expected = 0.25 * 0.5**2 * -torch.log(torch.tensor(0.5)) + 0.75 * p**2 * -torch.log(1 - p)
    assert float(sigmoid_focal_loss(logits, targets, num_boxes=1)) == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize(
    ("dn_number", "max_gt", "groups"), [(2, 3, 4), (100, 3, 33), (100, 200, 1), (5, 0, 1), (0, 4, 1)]
)
def test_dn_group_count_follows_the_official_rule(dn_number: int, max_gt: int, groups: int) -> None:
    assert dn_group_count(dn_number, max_gt) == groups


def test_denoising_attention_mask() -> None:
    mask = denoising_attn_mask(pad_size=8, num_queries=3, group_size=4, device=torch.device("cpu"))
    assert mask.shape == (11, 11)
    assert mask[8:, :8].all() and not mask[8:, 8:].any()  # matching queries never see denoising ones
    assert not mask[:8, 8:].any()  # denoising queries see the matching ones
    assert not mask[:4, :4].any() and mask[:4, 4:8].all() and mask[4:8, :4].all()


def test_zero_noise_queries_are_the_ground_truth(random_cxcywh: Callable[..., torch.Tensor]) -> None:
    label_enc = torch.nn.Embedding(6, 8)
    targets = [
        {"labels": torch.tensor([1, 4]), "boxes": random_cxcywh(2)},
        {"labels": torch.tensor([2]), "boxes": random_cxcywh(1, 5)},
    ]
    labels, boxes, mask, meta = prepare_for_cdn(
        targets=targets,
        dn_number=1,
        label_noise_ratio=0.0,
        box_noise_scale=0.0,
        num_queries=3,
        num_classes=5,
        hidden_dim=8,
        label_enc=label_enc,
    )
    assert meta == {"pad_size": 8, "num_dn_group": 2} and labels.shape == (2, 8, 8) and mask.shape == (11, 11)
    # Image 1 has one box: slot 0 of each positive/negative block holds it, slot 1 stays zero (padding).
    torch.testing.assert_close(boxes[1, 0].sigmoid(), targets[1]["boxes"][0])
    torch.testing.assert_close(labels[1, 2], label_enc.weight[2])
    assert labels[1, 1].abs().sum().item() == 0.0 and boxes[1, 3].abs().sum().item() == 0.0
    torch.testing.assert_close(boxes[0, :2].sigmoid(), targets[0]["boxes"])


def test_noisy_queries_stay_in_the_image(random_cxcywh: Callable[..., torch.Tensor]) -> None:
    torch.manual_seed(0)
    targets = [{"labels": torch.tensor([0, 1, 2]), "boxes": random_cxcywh(3)}]
    _, boxes, _, meta = prepare_for_cdn(
        targets=targets,
        dn_number=3,
        label_noise_ratio=0.5,
        box_noise_scale=1.0,
        num_queries=2,
        num_classes=3,
        hidden_dim=4,
        label_enc=torch.nn.Embedding(4, 4),
    )
    assert meta["pad_size"] == 36  # 6 groups x (3 positive + 3 negative)
    corners = box_cxcywh_to_xyxy(boxes.sigmoid())  # noised corners are clamped to the image
    assert ((corners >= -1e-3) & (corners <= 1 + 1e-3)).all()
    assert not torch.allclose(boxes.sigmoid()[0, :3], targets[0]["boxes"])


def test_losses_are_finite_without_any_target(
    tiny_model: torch.nn.Module, tiny_config: Callable[..., DINOConfig]
) -> None:
    images = torch.randn(2, 3, 64, 64)
    mask = torch.zeros(2, 64, 64, dtype=torch.bool)
    targets = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}] * 2
    tiny_model.train()
    try:
        out = tiny_model(images, mask, targets=targets)
    finally:
        tiny_model.eval()
    assert out["dn_meta"] == {"pad_size": 0, "num_dn_group": 1}
    losses = build_criterion(tiny_config())(out, targets)
    assert all(torch.isfinite(v).all() for v in losses.values())
    assert losses["loss_bbox"].item() == 0.0 and losses["loss_ce"].item() > 0
