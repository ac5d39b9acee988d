"""The fused Triton deformable attention equals the pure path, in Triton's interpreter on CPU tensors.

Reference: ``ms_deform_attn_grid_sample`` in float64, outputs and the gradients of value, sampling locations and
attention weights for one random output gradient. The kernel computes in float32, so the tolerances are float32
ones: 1e-5 relative, plus 2e-6 absolute on outputs, value and weight gradients (inputs of order 1) and 2e-5 on location
gradients (scaled by the level's width or height). bfloat16 and float16 values are compared with the reference on the
same rounded values and output gradient; what is left is the rounding of the results to that dtype: 2e-2 (bfloat16)
and 3e-3 (float16) absolute on outputs and value gradients of order 1, float32 ones on weight and location gradients.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a function, Triton's own ``tl.sum`` and ``tl.zeros``
included, at Triton's import; the repository's conftest imports ``torch._dynamo`` and with it Triton before any test
module. So without ``TRITON_INTERPRET=1`` in the environment this module runs one test,
:func:`test_in_the_triton_interpreter`, which runs the others in a pytest subprocess that has it (they are skipped in
the parent, by name of that test).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dinops.model import ms_deform_attn_core as core
from dinops.model.deformable_attention import MSDeformAttn
from dinops.model.ms_deform_attn_core import ms_deform_attn_grid_sample, prepare_value, sample_pixels
from dinops.settings import SettingsError

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED:
    from dinops.model.ms_deform_attn_triton import ms_deform_attn_triton


@pytest.fixture(autouse=True)
def _in_the_interpreter_only(request):
    if not INTERPRETED and request.node.originalname != "test_in_the_triton_interpreter":
        pytest.skip("run by test_in_the_triton_interpreter, with TRITON_INTERPRET=1")


@pytest.mark.skipif(INTERPRETED, reason="this is the subprocess")
def test_in_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-rs", __file__]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout, result.stdout[-2000:]


FP32_ATOL = {"output": 2e-6, "value": 2e-6, "locations": 2e-5, "weights": 2e-6}
LOW_ATOL = {
    torch.bfloat16: {"output": 2e-2, "value": 2e-2, "locations": 2e-5, "weights": 2e-6},
    torch.float16: {"output": 3e-3, "value": 3e-3, "locations": 2e-5, "weights": 2e-6},
}


def _inputs(shapes, batch=2, queries=9, heads=2, channels=4, points=2, low=-0.2, high=1.2, seed=0):
    """float64 ``(value, locations, weights, output gradient)``; locations uniform in ``[low, high)``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(h * w for h, w in shapes)
    value = torch.randn(batch, tokens, heads, channels, generator=gen, dtype=torch.float64)
    locations = torch.rand(batch, queries, heads, len(shapes), points, 2, generator=gen, dtype=torch.float64)
    weights = torch.rand(batch, queries, heads, len(shapes), points, generator=gen, dtype=torch.float64)
    grad_output = torch.randn(batch, queries, heads * channels, generator=gen, dtype=torch.float64)
    return value, locations * (high - low) + low, weights, grad_output


def _run(fn, shapes, value, locations, weights, grad_output):
    leaves = [t.detach().clone().requires_grad_() for t in (value, locations, weights)]
    output = fn(leaves[0], shapes, leaves[1], leaves[2])
    output.backward(grad_output.to(output.dtype))
    return {"output": output, "value": leaves[0].grad, "locations": leaves[1].grad, "weights": leaves[2].grad}


def _check_against_pure(shapes, inputs, dtype=torch.float32):
    """The kernel with ``dtype`` values and output gradient, float32 locations and weights, against the reference."""
    value, locations, weights, grad_output = inputs
    value, grad_output = value.to(dtype), grad_output.to(dtype)
    got = _run(ms_deform_attn_triton, shapes, value, locations.float(), weights.float(), grad_output)
    expected = _run(ms_deform_attn_grid_sample, shapes, value.double(), locations, weights, grad_output.double())
    for name, tolerance in (FP32_ATOL if dtype == torch.float32 else LOW_ATOL[dtype]).items():
        assert got[name].dtype == (dtype if name in ("output", "value") else torch.float32), name
        message = functools.partial("{}: {}".format, name)
        torch.testing.assert_close(got[name].double(), expected[name], rtol=1e-5, atol=tolerance, msg=message)
    return got


CASES = {
    # odd level shapes, a level one pixel wide, channels not a power of two (masked lanes), some points off the map
    "odd levels": ([(7, 5), (3, 1), (2, 3)], {"batch": 1, "channels": 6, "points": 3}),
    # more queries than one program's block (BLOCK_Q, 32) with a partial last block; one image, one head
    "many queries": ([(4, 6), (2, 3)], {"batch": 1, "queries": 150, "heads": 1}),
    # several images with different values at the same locations (the image offset of every gather)
    "batch of images": ([(5, 4), (3, 2)], {"batch": 3, "heads": 1}),
    # every location within a pixel of the border: taps half in, half out (grid_sample's partial corners)
    "border": ([(4, 3), (2, 2)], {"low": -0.5, "high": 1.5, "queries": 24, "heads": 1}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_and_gradients_match_the_pure_path(case):
    shapes, sizes = CASES[case]
    _check_against_pure(shapes, _inputs(shapes, **sizes))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_values_accumulate_in_float32(dtype):
    shapes = [(6, 5), (3, 2)]
    _check_against_pure(shapes, _inputs(shapes, batch=1, channels=8, seed=1), dtype)


def test_points_off_the_map_read_zero_and_get_no_gradient():
    shapes = [(4, 3), (2, 2)]
    value, locations, weights, grad_output = _inputs(shapes, batch=1, queries=4, heads=1)
    # 1.5 pixels or more outside on the 4x3 level, and far away: no tap is inside
    far = torch.tensor([-0.6, 1.6, -1e6, 1e6], dtype=torch.float64)
    locations = far[torch.randint(0, len(far), locations.shape, generator=torch.Generator().manual_seed(2))]
    got = _run(ms_deform_attn_triton, shapes, value.float(), locations.float(), weights.float(), grad_output.float())
    for name, result in got.items():
        assert torch.equal(result, torch.zeros_like(result)), name


def test_nan_and_infinite_locations_give_nan_as_grid_sample_does():
    shapes = [(4, 3)]
    value, locations, weights, _ = _inputs(shapes, batch=1, queries=3, heads=1, points=1)
    locations[0, :, 0, 0, 0, 0] = torch.tensor([float("nan"), float("inf"), 0.5])
    expected = ms_deform_attn_grid_sample(value, shapes, locations, weights)
    with np.errstate(invalid="ignore"):  # the interpreter computes in numpy: inf - floor(inf) is NaN, as on a GPU
        got = ms_deform_attn_triton(value.float(), shapes, locations.float(), weights.float())
    assert got[0, :2].isnan().all() and expected[0, :2].isnan().all()
    torch.testing.assert_close(got[0, 2].double(), expected[0, 2], rtol=1e-5, atol=2e-6)


def test_padding_mask_and_module_gradients_match_the_pure_path(monkeypatch):
    """MSDeformAttn with a padding mask (values zeroed there) and both reference point kinds, triton vs grid_sample:
    outputs and the gradients of the input map, the queries and every parameter."""
    torch.manual_seed(0)
    shapes = [(5, 7), (3, 4)]
    module = MSDeformAttn(d_model=8, n_levels=2, n_heads=1, n_points=2)
    torch.nn.init.normal_(module.sampling_offsets.weight, std=0.5)  # offsets that depend on the query
    torch.nn.init.normal_(module.attention_weights.weight, std=0.5)
    tokens = sum(h * w for h, w in shapes)
    source = torch.randn(2, tokens, 8)
    mask = torch.zeros(2, tokens, dtype=torch.bool)
    mask[1, 20:35] = True  # image 1 padded on the right part of level 0
    query = torch.randn(2, 10, 8)
    points = {2: torch.rand(2, 10, 2, 2), 4: torch.cat([torch.rand(2, 10, 2, 2), torch.rand(2, 10, 2, 2) * 0.5], -1)}
    for kind, reference in points.items():
        results = []
        for backend in ("grid_sample", "triton"):
            monkeypatch.setattr(core, "_forced", backend)
            module.zero_grad()
            inputs = [t.clone().requires_grad_() for t in (source, query)]
            output = module(inputs[1], reference, inputs[0], shapes, mask)
            output.square().sum().backward()
            grads = [t.grad for t in inputs] + [p.grad for p in module.parameters()]
            results.append((output, grads))
        (expected, expected_grads), (got, got_grads) = results
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=f"output, {kind}-value references")
        for index, (a, b) in enumerate(zip(got_grads, expected_grads, strict=True)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"gradient {index}, {kind}-value references")


def test_pixel_locations_as_the_encoder_gives_them(monkeypatch):
    shapes = [(5, 4), (2, 3)]
    value, locations, weights, _ = _inputs(shapes)
    sizes = torch.tensor([[w, h] for h, w in shapes], dtype=torch.float64)[:, None]
    pixels = locations * sizes - 0.5
    results = []
    for backend in ("grid_sample", "triton"):
        monkeypatch.setattr(core, "_forced", backend)
        prepared = prepare_value(value.float(), shapes, points=2)
        assert prepared.backend == backend
        results.append(sample_pixels(prepared, pixels.float().clone(), weights.float()))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-5)


def test_float64_values_take_the_pure_path(monkeypatch):
    monkeypatch.setattr(core, "_forced", "triton")
    assert prepare_value(torch.zeros(1, 6, 1, 2, dtype=torch.float64), [(2, 3)], points=1).backend == "grid_sample"
    assert prepare_value(torch.zeros(1, 6, 1, 2, dtype=torch.bfloat16), [(2, 3)], points=1).backend == "triton"


@pytest.mark.parametrize(
    "mode,expected", [("auto", {"gather", "grid_sample"}), ("pure", {"gather", "grid_sample"}), ("triton", {"triton"})]
)
def test_setting_chooses_the_backend_on_cpu(monkeypatch, mode, expected):
    """auto and pure never use the kernel on a CPU (auto: only on CUDA); triton uses it, here in the interpreter."""
    monkeypatch.setattr(core, "_chosen", {})
    monkeypatch.setattr(core, "_forced", None)
    monkeypatch.setenv("DINO_DEFORM_ATTN", mode)
    if mode != "triton":
        monkeypatch.setattr(core, "ms_deform_attn_fused", None)  # calling it would fail the test
    assert core.deformable_attention_backend("cpu") in expected


def test_forcing_a_kernel_that_fails_is_an_error_and_a_bad_name_too(monkeypatch):
    def broken(*args):
        raise RuntimeError("no Triton here")

    monkeypatch.setattr(core, "_chosen", {})
    monkeypatch.setattr(core, "_forced", None)
    monkeypatch.setattr(core, "ms_deform_attn_fused", broken)
    monkeypatch.setenv("DINO_DEFORM_ATTN", "triton")
    with pytest.raises(RuntimeError, match="DINO_DEFORM_ATTN=triton: the fused kernel fails on cpu: no Triton here"):
        core.deformable_attention_backend("cpu")
    monkeypatch.setenv("DINO_DEFORM_ATTN", "fused")
    with pytest.raises(SettingsError, match="DINO_DEFORM_ATTN='fused' must be one of auto, triton, pure"):
        core.deformable_attention_backend("cpu")


def test_contract_violations_are_named():
    shapes = [(2, 3)]
    value, locations, weights, _ = _inputs(shapes, batch=1, queries=2)
    with pytest.raises(ValueError, match=r"value has 6 tokens, the spatial shapes \[\(2, 2\)\] make 4"):
        ms_deform_attn_triton(value.float(), [(2, 2)], locations.float(), weights.float())
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        ms_deform_attn_triton(value, shapes, locations, weights)
