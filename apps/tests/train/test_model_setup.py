from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dinops.settings import SettingsError
from dinops.train.engine import box_count_scales
from dinops.train.model_setup import TINY, lr_factor, memory_format, param_groups, parse_overrides
from dinops.train.settings import SETTINGS


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


def test_channels_last_is_the_gpu_layout_when_set():
    on, off = SimpleNamespace(channels_last=True), SimpleNamespace(channels_last=False)
    assert memory_format(on, torch.device("cuda", 0)) == torch.channels_last
    assert memory_format(off, torch.device("cuda", 0)) == torch.contiguous_format
    assert memory_format(on, torch.device("cpu")) == torch.contiguous_format
    assert next(s for s in SETTINGS if s.dest == "channels_last").default is True


def test_a_training_step_in_channels_last_layout_equals_the_contiguous_one():
    """--channels-last changes the memory order of the convolutions, not the arithmetic: one training step of the tiny
    model in either layout (on this CPU; on a GPU cuDNN's NHWC kernels) gives the same losses and gradients.

    In float64: the two layouts take different convolution kernels whose float32 rounding, amplified through the
    backbone, differs from one CPU to the next (a deep weight's gradient differed by 4e-3 of its scale on an AMD EPYC
    where an Intel Xeon gave under 1e-4). In float64 that rounding is below 1e-9, so the bound holds on any machine
    and a real difference of arithmetic (a transposed weight, a wrong stride) still shows."""
    from dinops.model import DINOConfig

    cfg = DINOConfig().replace(**TINY, num_classes=5, dn_labelbook_size=5)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 96, 128, generator=gen)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 100:] = True
    targets = [
        {"boxes": torch.rand(3, 2, generator=gen) * 0.4 + 0.3, "labels": torch.tensor([1, 2, 3])} for _ in range(2)
    ]
    targets = [{"boxes": torch.cat([t["boxes"], t["boxes"] * 0.5], 1), "labels": t["labels"]} for t in targets]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the model's own tensors (embeddings, positions) in float64 too
    try:
        targets = [{"boxes": t["boxes"].double(), "labels": t["labels"]} for t in targets]
        results = [_one_step(cfg, images.double(), mask, targets, layout)
                   for layout in (torch.contiguous_format, torch.channels_last)]  # fmt: skip
    finally:
        torch.set_default_dtype(default_dtype)
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a.dtype == torch.float64
    assert torch.allclose(loss_a, loss_b, rtol=1e-9), (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 50
    for name, grad in grads_a.items():
        scale = grad.abs().max().clamp_min(1e-12)
        assert ((grad - grads_b[name]).abs().max() / scale) < 1e-9, name


def _one_step(cfg, images, mask, targets, layout):
    """One training step of a fresh tiny model in ``layout``: the weighted loss and every parameter's gradient."""
    from dinops.model import build_criterion, build_dino

    torch.manual_seed(0)
    model, criterion = build_dino(cfg).to(memory_format=layout).train(), build_criterion(cfg)
    torch.manual_seed(1)  # the same denoising noise in both runs
    losses = criterion(model(images.contiguous(memory_format=layout), mask, targets=targets), targets)
    total = sum(losses[k] * criterion.weight_dict[k] for k in losses if k in criterion.weight_dict)
    total.backward()
    convolutions = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convolutions) > 20
    assert all(w.is_contiguous(memory_format=layout) for w in convolutions)
    return total.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
