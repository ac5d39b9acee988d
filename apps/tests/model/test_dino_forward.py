"""Forward passes of tiny configurations: shapes, input sizes, feature levels, two-stage variants, denoising."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dinops.model import DINOConfig, build_criterion, build_dino, pad_images


def _images(batch: int, height: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return pad_images([torch.randn(3, height - 7 * i, width - 5 * i, generator=gen) for i in range(batch)])


def _targets(
    random_cxcywh: Callable[..., torch.Tensor], counts: list[int], classes: int
) -> list[dict[str, torch.Tensor]]:
    return [{"labels": torch.arange(n) % classes, "boxes": random_cxcywh(n, seed=i)} for i, n in enumerate(counts)]


@pytest.mark.parametrize(("height", "width"), [(64, 96), (97, 75)])
def test_forward_on_two_sizes(tiny_model: torch.nn.Module, height: int, width: int) -> None:
    images, mask = _images(2, height, width)
    with torch.no_grad():
        out = tiny_model(images, mask)
    assert out["pred_logits"].shape == (2, 12, 3)
    assert out["pred_boxes"].shape == (2, 12, 4)
    assert len(out["aux_outputs"]) == 1
    assert out["interm_outputs"]["pred_logits"].shape == (2, 12, 3)
    assert out["dn_meta"] is None
    boxes = out["pred_boxes"]
    assert torch.isfinite(out["pred_logits"]).all() and ((boxes >= 0) & (boxes <= 1)).all()


def test_padded_image_gets_its_valid_ratios(tiny_model: torch.nn.Module) -> None:
    """An image batched with a larger one sees only its valid area (ratios (w, h) per level), with finite outputs."""
    images, mask = pad_images([torch.randn(3, 96, 96), torch.randn(3, 48, 72)])
    with torch.no_grad():
        out = tiny_model(images, mask, return_intermediates=True)
    ratios = out["intermediates"]["transformer"].valid_ratios
    assert ratios[0].tolist() == [[1.0, 1.0]] * 4
    assert ratios[1, 0].tolist() == [0.75, 0.5]  # level 0 (stride 8): 9 of 12 columns, 6 of 12 rows
    assert torch.isfinite(out["pred_boxes"]).all()


@pytest.mark.parametrize(
    ("levels", "indices"), [(1, [3]), (2, [3]), (3, [1, 2, 3]), (4, [1, 2, 3]), (5, [0, 1, 2, 3]), (4, [2, 3])]
)
def test_feature_level_configurations(tiny_config: Callable[..., DINOConfig], levels: int, indices: list[int]) -> None:
    torch.manual_seed(0)
    model = build_dino(tiny_config(num_feature_levels=levels, return_interm_indices=indices, num_queries=5)).eval()
    images, mask = _images(1, 96, 96)
    with torch.no_grad():
        out = model(images, mask, return_intermediates=True)
    assert len(out["intermediates"]["transformer"].spatial_shapes) == levels
    assert out["pred_boxes"].shape == (1, 5, 4)
    assert ("transformer.level_embed" in model.state_dict()) == (levels > 1)
    assert len(model.input_proj) == levels


def test_two_stage_no_and_unshared_heads(tiny_config: Callable[..., DINOConfig]) -> None:
    cfg = tiny_config(two_stage_type="no", dec_pred_bbox_embed_share=False, dec_pred_class_embed_share=False)
    model = build_dino(cfg).eval()
    state = model.state_dict()
    assert state["transformer.refpoint_embed.weight"].shape == (12, 4)
    assert not any(k.startswith("transformer.enc_") for k in state)
    images, mask = _images(1, 64, 64)
    with torch.no_grad():
        out = model(images, mask)
    assert "interm_outputs" not in out
    assert out["pred_logits"].shape == (1, 12, 3)
    weights = build_criterion(cfg).weight_dict
    assert not any(k.endswith("_interm") for k in weights)


def test_too_many_queries_for_the_image_is_a_clear_error(tiny_config: Callable[..., DINOConfig]) -> None:
    model = build_dino(tiny_config(num_queries=500)).eval()
    images, mask = _images(1, 64, 64)
    with torch.no_grad(), pytest.raises(ValueError, match="num_queries=500 exceeds"):
        model(images, mask)


def test_training_forward_with_denoising_queries(
    tiny_config: Callable[..., DINOConfig], random_cxcywh: Callable[..., torch.Tensor]
) -> None:
    torch.manual_seed(0)
    cfg = tiny_config()
    model = build_dino(cfg).train()
    images, mask = _images(2, 64, 80)
    targets = _targets(random_cxcywh, [3, 1], 3)
    out = model(images, mask, targets=targets)
    meta = out["dn_meta"]
    # dn_number=2 -> 4 groups of (3 positive + 3 negative) slots for max_gt=3.
    assert (meta["pad_size"], meta["num_dn_group"]) == (24, 4)
    known = meta["output_known_lbs_bboxes"]
    assert known["pred_logits"].shape == (2, 24, 3)
    assert len(known["aux_outputs"]) == 1
    assert out["pred_logits"].shape == (2, 12, 3)
    losses = build_criterion(cfg)(out, targets)
    assert losses["loss_ce_dn"] > 0 and losses["loss_bbox_dn_0"] > 0
    total = sum(losses[k] * w for k, w in build_criterion(cfg).weight_dict.items())
    total.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    assert grads["label_enc.weight"] is not None and grads["label_enc.weight"].abs().sum() > 0
    assert grads["transformer.encoder.layers.0.self_attn.sampling_offsets.weight"].abs().sum() > 0
    assert grads["backbone.0.body.layer2.0.conv1.weight"].abs().sum() > 0
    assert all(p.grad is None for name, p in model.named_parameters() if "layer1" in name)


def test_eval_mode_ignores_targets(tiny_model: torch.nn.Module, random_cxcywh: Callable[..., torch.Tensor]) -> None:
    images, mask = _images(1, 64, 64)
    with torch.no_grad():
        plain = tiny_model(images, mask)
        with_targets = tiny_model(images, mask, targets=_targets(random_cxcywh, [2], 3))
    assert with_targets["dn_meta"] is None
    assert torch.equal(plain["pred_logits"], with_targets["pred_logits"])


def test_bfloat16_autocast_trains_and_infers(
    tiny_config: Callable[..., DINOConfig], random_cxcywh: Callable[..., torch.Tensor]
) -> None:
    torch.manual_seed(0)
    cfg = tiny_config()
    model = build_dino(cfg).train()
    images, mask = _images(2, 64, 64)
    targets = _targets(random_cxcywh, [2, 1], 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = build_criterion(cfg)(model(images, mask, targets=targets), targets)
    total = sum(losses[k] * w for k, w in build_criterion(cfg).weight_dict.items())
    assert torch.isfinite(total)
    total.backward()
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images, mask)
    assert torch.isfinite(out["pred_boxes"]).all() and out["pred_logits"].shape == (2, 12, 3)


def test_mask_defaults_to_no_padding_and_is_checked(tiny_model: torch.nn.Module) -> None:
    images, mask = _images(1, 64, 64)
    with torch.no_grad():
        assert torch.equal(tiny_model(images)["pred_logits"], tiny_model(images, mask)["pred_logits"])
        with pytest.raises(ValueError, match="mask must be bool"):
            tiny_model(images, mask.float())
