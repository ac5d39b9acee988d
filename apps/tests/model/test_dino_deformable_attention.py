"""Deformable attention: both sampling backends agree in values and gradients; backend choice and reporting."""

from __future__ import annotations

import pytest
import torch

from dinops.model import deformable_attention_backend, set_deformable_attention_backend
from dinops.model.deformable_attention import MSDeformAttn
from dinops.model.ms_deform_attn_core import ms_deform_attn, ms_deform_attn_gather, ms_deform_attn_grid_sample

SHAPES = [(7, 9), (4, 5), (2, 3)]


def _inputs(dtype: torch.dtype = torch.float64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(h * w for h, w in SHAPES)
    value = torch.randn(2, tokens, 2, 4, generator=gen, dtype=dtype)
    locations = torch.rand(2, 6, 2, len(SHAPES), 3, 2, generator=gen, dtype=dtype) * 1.6 - 0.3  # some off-map
    weights = torch.rand(2, 6, 2, len(SHAPES), 3, generator=gen, dtype=dtype)
    return value, locations, weights


def test_backends_agree_in_values_and_gradients() -> None:
    value, locations, weights = _inputs()
    results = []
    for fn in (ms_deform_attn_grid_sample, ms_deform_attn_gather):
        leaves = [t.clone().requires_grad_() for t in (value, locations, weights)]
        out = fn(leaves[0], SHAPES, leaves[1], leaves[2])
        grads = torch.autograd.grad(out.square().sum(), leaves)
        results.append((out, grads))
    (out_a, grads_a), (out_b, grads_b) = results
    assert out_a.shape == (2, 6, 8)
    torch.testing.assert_close(out_a, out_b, rtol=0, atol=1e-12)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_samples_off_the_map_read_zeros() -> None:
    value, locations, weights = _inputs(torch.float32)
    far = torch.full_like(locations, 5.0)
    assert float(ms_deform_attn_gather(value, SHAPES, far, weights).abs().max()) == 0.0
    # A pixel centre reads exactly that pixel: level 0, location of pixel (x=2, y=1).
    single = torch.zeros_like(locations)
    single[..., 0, :, 0] = 2.5 / 9
    single[..., 0, :, 1] = 1.5 / 7
    only_level0 = torch.zeros_like(weights)
    only_level0[..., 0, 0] = 1.0
    out = ms_deform_attn_gather(value, SHAPES, single, only_level0).view(2, 6, 2, 4)
    torch.testing.assert_close(out[:, 0], value[:, 1 * 9 + 2])


def test_nan_locations_do_not_crash() -> None:
    value, locations, weights = _inputs(torch.float32)
    locations[0, 0, 0, 0, 0, 0] = float("nan")
    assert ms_deform_attn_gather(value, SHAPES, locations, weights).shape == (2, 6, 8)


def test_backend_is_reported_and_can_be_forced() -> None:
    chosen = deformable_attention_backend("cpu")
    assert chosen == "gather"  # passes its self-check against grid_sample on CPU
    try:
        set_deformable_attention_backend("grid_sample")
        assert deformable_attention_backend() == "grid_sample"
        with pytest.raises(ValueError, match="unknown deformable attention backend"):
            set_deformable_attention_backend("cuda")
    finally:
        set_deformable_attention_backend(None)
    assert deformable_attention_backend() == chosen


def test_low_precision_values_are_sampled_in_float32() -> None:
    value, locations, weights = _inputs(torch.float32)
    expected = ms_deform_attn(value, SHAPES, locations, weights)
    # Under autocast the values come in bfloat16, the locations in float32 (float32 reference + offsets).
    got = ms_deform_attn(value.bfloat16(), SHAPES, locations, weights.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=0.05, rtol=0.02)


def test_module_with_point_and_box_references() -> None:
    torch.manual_seed(0)
    attn = MSDeformAttn(d_model=16, n_levels=3, n_heads=2, n_points=3)
    tokens = sum(h * w for h, w in SHAPES)
    memory = torch.randn(1, tokens, 16)
    query = torch.randn(1, 5, 16)
    padding = torch.zeros(1, tokens, dtype=torch.bool)
    points = attn(query, torch.rand(1, 5, 3, 2), memory, SHAPES, padding)
    boxes = attn(query, torch.rand(1, 5, 3, 4), memory, SHAPES, padding)
    assert points.shape == boxes.shape == (1, 5, 16)
    with pytest.raises(ValueError, match="2 or 4"):
        attn(query, torch.rand(1, 5, 3, 3), memory, SHAPES, padding)
    # Padded tokens carry no value: masking everything leaves only the output projection's bias.
    blind = attn(query, torch.rand(1, 5, 3, 2), memory, SHAPES, torch.ones(1, tokens, dtype=torch.bool))
    torch.testing.assert_close(blind, attn.output_proj.bias.expand(1, 5, 16))
