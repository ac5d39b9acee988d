"""Numerical fidelity against the official implementation's outputs on the small reference model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dinops.model import DINOConfig, build_criterion, build_dino, postprocess, set_deformable_attention_backend
from dinops.model.criterion import weighted_total
from dinops.model.inference import optimize_for_inference

# Tolerances of shared/dino/README.md.
LOGITS_ATOL = 1e-4
BOXES_ATOL = 2e-5
SCORES_ATOL = 2.5e-5
PIXELS_ATOL = 2e-3


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.detach().double() - b.detach().double()).abs().max())


@pytest.fixture(scope="module")
def reference_outputs(small_dir: Path) -> dict[str, Any]:
    return torch.load(small_dir / "outputs.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference_intermediates(small_dir: Path) -> dict[str, Any]:
    return torch.load(small_dir / "intermediates.pt", weights_only=True)


@pytest.fixture(scope="module", params=[37, 512], ids=["chunks-of-37", "chunks-of-512"])
def small_fast_outputs(
    request: pytest.FixtureRequest,
    small_args: dict[str, Any],
    small_state_dict: dict[str, torch.Tensor],
    small_inputs: dict[str, Any],
) -> dict[str, Any]:
    """The small model on the fast inference path (batch norm folded, channels-last, encoder in token chunks; 37
    does not divide the 310 tokens, 512 is the default and holds them all)."""
    model = build_dino(DINOConfig.from_official(small_args))
    model.load_state_dict(small_state_dict, strict=True)
    optimize_for_inference(model, chunk_tokens=request.param)
    assert all(layer.chunk_tokens == request.param for layer in model.transformer.encoder.layers)
    with torch.inference_mode():
        return model(small_inputs["padded"], small_inputs["mask"], return_intermediates=True)


def test_outputs_match_official(small_eval_outputs: dict[str, Any], reference_outputs: dict[str, Any]) -> None:
    _assert_outputs_match(small_eval_outputs, reference_outputs)


def test_fast_path_outputs_match_official(
    small_fast_outputs: dict[str, Any], reference_outputs: dict[str, Any]
) -> None:
    _assert_outputs_match(small_fast_outputs, reference_outputs)


def test_fast_path_intermediates_match_official(
    small_fast_outputs: dict[str, Any], reference_intermediates: dict[str, Any]
) -> None:
    _assert_intermediates_match(small_fast_outputs, reference_intermediates)


def test_fast_path_postprocess_matches_official(
    small_fast_outputs: dict[str, Any], reference_outputs: dict[str, Any], small_inputs: dict[str, Any]
) -> None:
    results = postprocess(
        small_fast_outputs, small_inputs["orig_target_sizes"], num_select=reference_outputs["num_select"]
    )
    _assert_postprocess_matches(results, reference_outputs)


def test_fast_path_equals_the_reference_path(
    small_fast_outputs: dict[str, Any], small_eval_outputs: dict[str, Any]
) -> None:
    """Same model, two paths: float32 rounding apart (measured: logits 6.7e-6, boxes 1.2e-6, memory 2.3e-5, from
    the folded convolutions), well inside the official tolerances."""
    assert max_abs(small_fast_outputs["pred_logits"], small_eval_outputs["pred_logits"]) < LOGITS_ATOL / 4
    assert max_abs(small_fast_outputs["pred_boxes"], small_eval_outputs["pred_boxes"]) < BOXES_ATOL / 4
    fast, ref = small_fast_outputs["intermediates"]["transformer"], small_eval_outputs["intermediates"]["transformer"]
    assert max_abs(fast.memory, ref.memory) < 5e-5
    assert torch.equal(fast.topk_proposals, ref.topk_proposals)


def _assert_outputs_match(out: dict[str, Any], reference_outputs: dict[str, Any]) -> None:
    assert max_abs(out["pred_logits"], reference_outputs["pred_logits"]) < LOGITS_ATOL
    assert max_abs(out["pred_boxes"], reference_outputs["pred_boxes"]) < BOXES_ATOL
    assert len(out["aux_outputs"]) == 1
    assert max_abs(out["aux_outputs"][0]["pred_logits"], reference_outputs["aux_outputs.0.pred_logits"]) < LOGITS_ATOL
    assert max_abs(out["aux_outputs"][0]["pred_boxes"], reference_outputs["aux_outputs.0.pred_boxes"]) < BOXES_ATOL
    assert max_abs(out["interm_outputs"]["pred_logits"], reference_outputs["interm_outputs.pred_logits"]) < LOGITS_ATOL
    assert max_abs(out["interm_outputs"]["pred_boxes"], reference_outputs["interm_outputs.pred_boxes"]) < BOXES_ATOL
    pre = reference_outputs["interm_outputs_for_matching_pre.pred_boxes"]
    assert max_abs(out["interm_outputs_for_matching_pre"]["pred_boxes"], pre) < BOXES_ATOL
    assert out["dn_meta"] is None


def test_intermediates_match_official(
    small_eval_outputs: dict[str, Any], reference_intermediates: dict[str, Any]
) -> None:
    _assert_intermediates_match(small_eval_outputs, reference_intermediates)


def _assert_intermediates_match(outputs: dict[str, Any], reference_intermediates: dict[str, Any]) -> None:
    ours = outputs["intermediates"]
    ref = reference_intermediates
    result = ours["transformer"]
    assert [list(s) for s in result.spatial_shapes] == ref["spatial_shapes"].tolist()
    assert torch.equal(result.valid_ratios, ref["valid_ratios"])
    for level in range(len(ref["masks"])):
        assert torch.equal(ours["masks"][level], ref["masks"][level])
        assert max_abs(ours["pos_embeds"][level], ref["pos_embeds"][level]) < 1e-6
        assert max_abs(ours["srcs"][level], ref["srcs"][level]) < 1e-4
    assert max_abs(result.memory, ref["memory"]) < 1e-4
    proposals, expected = result.output_proposals, ref["output_proposals"]
    assert torch.equal(proposals.isinf(), expected.isinf())
    assert max_abs(proposals[~proposals.isinf()], expected[~expected.isinf()]) < 1e-5
    assert max_abs(result.enc_outputs_class_unselected, ref["enc_outputs_class_unselected"]) < LOGITS_ATOL
    assert torch.equal(result.topk_proposals, ref["topk_proposals"])
    assert max_abs(torch.stack(result.hs), ref["dec_hs"]) < 1e-4
    assert max_abs(torch.stack(result.references), ref["dec_references"]) < BOXES_ATOL


def _assert_postprocess_matches(results: list[dict[str, torch.Tensor]], reference: dict[str, Any]) -> None:
    for i, got in enumerate(results):
        scores = reference[f"postprocess.{i}.scores"]
        assert max_abs(got["scores"], scores) < SCORES_ATOL
        # Entries whose reference scores are within 5e-5 of each other may come in either order: compare each
        # entry against the reference entries of (almost) the same score.
        for k in range(len(scores)):
            candidates = ((scores - scores[k]).abs() <= 5e-5).nonzero().flatten()
            same = [
                int(got["labels"][k]) == int(reference[f"postprocess.{i}.labels"][j])
                and max_abs(got["boxes"][k], reference[f"postprocess.{i}.boxes"][j]) < PIXELS_ATOL
                for j in candidates
            ]
            assert any(same), f"image {i} entry {k} has no matching reference entry"


def test_postprocess_matches_official(
    small_eval_outputs: dict[str, Any], reference_outputs: dict[str, Any], small_inputs: dict[str, Any]
) -> None:
    results = postprocess(
        small_eval_outputs, small_inputs["orig_target_sizes"], num_select=reference_outputs["num_select"]
    )
    assert [len(r["scores"]) for r in results] == [100, 100]
    _assert_postprocess_matches(results, reference_outputs)


def test_grid_sample_backend_matches_official(
    small_model: torch.nn.Module, small_inputs: dict[str, Any], reference_outputs: dict[str, Any]
) -> None:
    set_deformable_attention_backend("grid_sample")
    try:
        small_model.eval()
        with torch.no_grad():
            out = small_model(small_inputs["padded"], small_inputs["mask"])
    finally:
        small_model.train()
        set_deformable_attention_backend(None)
    assert max_abs(out["pred_logits"], reference_outputs["pred_logits"]) < LOGITS_ATOL
    assert max_abs(out["pred_boxes"], reference_outputs["pred_boxes"]) < BOXES_ATOL
    assert max_abs(out["interm_outputs"]["pred_logits"], reference_outputs["interm_outputs.pred_logits"]) < LOGITS_ATOL


def _loss_run(
    args: dict[str, Any],
    overrides: dict[str, Any],
    state_dict: dict[str, torch.Tensor],
    inputs: dict[str, Any],
    targets: list[dict[str, torch.Tensor]],
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, float]]:
    cfg = DINOConfig.from_official({**args, **overrides})
    model = build_dino(cfg)
    model.load_state_dict(state_dict, strict=True)
    model.train()
    criterion = build_criterion(cfg)
    out = model(inputs["padded"], inputs["mask"], targets=targets if cfg.use_dn else None)
    return out, criterion(out, targets), criterion.weight_dict


def _assert_losses_match(
    losses: dict[str, torch.Tensor], weight_dict: dict[str, float], reference: dict[str, Any]
) -> None:
    assert weight_dict == reference["weight_dict"]
    assert set(losses) == set(reference["losses"])
    for key, expected in reference["weighted_terms"].items():
        got = losses[key].item() * weight_dict[key]
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), key
    total = weighted_total(losses, weight_dict).item()
    assert total == pytest.approx(reference["total_weighted_loss"], rel=1e-5, abs=1e-6)


def test_losses_without_denoising_match_official(
    small_dir: Path,
    small_args: dict[str, Any],
    small_state_dict: dict[str, torch.Tensor],
    small_inputs: dict[str, Any],
    small_targets: list[dict[str, torch.Tensor]],
) -> None:
    reference = json.loads((small_dir / "losses.json").read_text())
    _, losses, weights = _loss_run(
        small_args, small_args["_loss_run_overrides"], small_state_dict, small_inputs, small_targets
    )
    _assert_losses_match(losses, weights, reference)
    assert losses["class_error"].item() == pytest.approx(reference["losses"]["class_error"])
    assert losses["cardinality_error"].item() == pytest.approx(reference["losses"]["cardinality_error"])


def test_losses_with_zero_noise_denoising_match_official(
    small_dir: Path,
    small_args: dict[str, Any],
    small_state_dict: dict[str, torch.Tensor],
    small_inputs: dict[str, Any],
    small_targets: list[dict[str, torch.Tensor]],
) -> None:
    reference = json.loads((small_dir / "losses_dn_zero_noise.json").read_text())
    expected_out = torch.load(small_dir / "outputs_dn_zero_noise_train.pt", weights_only=True)
    out, losses, weights = _loss_run(
        small_args, small_args["_dn_zero_noise_run_overrides"], small_state_dict, small_inputs, small_targets
    )
    _assert_losses_match(losses, weights, reference)
    meta = out["dn_meta"]
    assert {k: meta[k] for k in ("pad_size", "num_dn_group")} == expected_out["dn_meta"]
    known = meta["output_known_lbs_bboxes"]
    assert max_abs(known["pred_logits"], expected_out["dn.pred_logits"]) < LOGITS_ATOL
    assert max_abs(known["pred_boxes"], expected_out["dn.pred_boxes"]) < BOXES_ATOL
    assert max_abs(known["aux_outputs"][0]["pred_logits"], expected_out["dn.aux_outputs.0.pred_logits"]) < LOGITS_ATOL
    assert max_abs(known["aux_outputs"][0]["pred_boxes"], expected_out["dn.aux_outputs.0.pred_boxes"]) < BOXES_ATOL
    assert max_abs(out["pred_logits"], expected_out["pred_logits"]) < LOGITS_ATOL
    assert max_abs(out["interm_outputs"]["pred_boxes"], expected_out["interm_outputs.pred_boxes"]) < BOXES_ATOL
