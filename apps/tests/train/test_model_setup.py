from __future__ import annotations

import pytest
import torch

from dinops.settings import SettingsError
from dinops.train.engine import box_count_scales
from dinops.train.model_setup import lr_factor, param_groups, parse_overrides


def test_overrides_are_typed_and_checked():
    assert parse_overrides(
        "hidden_dim=128, use_dn=false,dropout=0.1,return_interm_indices=1:2:3,backbone=resnet18"
    ) == {
        "hidden_dim": 128,
        "use_dn": False,
        "dropout": 0.1,
        "return_interm_indices": [1, 2, 3],
        "backbone": "resnet18",
    }
    with pytest.raises(SettingsError, match="'hiden_dim=1' is not NAME=VALUE with a DINOConfig name"):
        parse_overrides("hiden_dim=1")
    with pytest.raises(SettingsError, match="hidden_dim='wide'"):
        parse_overrides("hidden_dim=wide")


def test_lr_factor_warmup_and_drops():
    assert lr_factor(0, 10, [100]) == pytest.approx(0.001)
    assert lr_factor(5, 10, [100]) == pytest.approx(0.001 + 0.999 * 0.5)
    assert lr_factor(10, 10, [100]) == 1.0
    assert lr_factor(100, 10, [100]) == pytest.approx(0.1)
    assert lr_factor(250, 0, [100, 200]) == pytest.approx(0.01)


def test_param_groups_split_the_backbone():
    model = torch.nn.ModuleDict({"backbone": torch.nn.Linear(2, 2), "head": torch.nn.Linear(2, 3)})
    model["backbone"].bias.requires_grad_(False)
    groups = param_groups(model, lr=1e-4, lr_backbone=1e-5)
    assert [g["lr"] for g in groups] == [1e-4, 1e-5]
    assert [len(g["params"]) for g in groups] == [2, 1]  # the frozen bias is left out


def test_box_count_scales_make_micro_batches_sum_to_the_big_batch():
    # the criterion divides by each micro-batch's boxes; the scales turn that into division by all boxes
    boxes = [3, 1]
    scales = box_count_scales(boxes, torch.device("cpu"))
    per_box_loss = [2.0, 5.0]  # sum of per-box losses of each micro-batch
    criterion_losses = [per_box_loss[i] / boxes[i] for i in range(2)]
    assert sum(c * s for c, s in zip(criterion_losses, scales, strict=True)) == pytest.approx(sum(per_box_loss) / 4)
    assert box_count_scales([5], torch.device("cpu")) == [1.0]
    assert box_count_scales([0, 2], torch.device("cpu")) == pytest.approx([0.5, 1.0])  # empty images still count once
