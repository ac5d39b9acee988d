"""Fused multi-scale deformable attention in Triton: forward and backward as one ``torch.autograd.Function``.

Same contract as :mod:`dinops.model.ms_deform_attn_core`::

    value               [B, S, M, D]        float32, bfloat16 or float16; S = sum(H_l * W_l)
    spatial_shapes      [(H_l, W_l), ...]   L levels, in the token order of ``value``
    sampling_locations  [B, Q, M, L, P, 2]  normalised (x, y) in 0..1 of level l's map
    attention_weights   [B, Q, M, L, P]     softmax-normalised over L*P
    -> output           [B, Q, M*D]         value's dtype

Locations and weights are sampled in float32 whatever their dtype (a pixel coordinate near 100 in bfloat16 is off
by up to a quarter pixel), and every sum is float32; the gradient of ``value`` is accumulated in float32 and returned
in value's dtype. Bilinear sampling as ``F.grid_sample(align_corners=False, padding_mode="zeros")``, the pure path's
convention (kernels in :mod:`dinops.model.ms_deform_attn_kernels`).

Triton compiles the kernels just in time for CUDA tensors; with ``TRITON_INTERPRET=1`` set before this module is
imported, they run in Triton's interpreter on CPU tensors (how the tests check them against the pure path).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
from torch import Tensor
from torch.autograd.function import once_differentiable

from dinops.model.ms_deform_attn_kernels import ms_deform_attn_backward_kernel, ms_deform_attn_forward_kernel

VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Queries per program (each tap gathers a [BLOCK_Q, D] tile) and warps per program. `make gpu-bench`'s sweep on an
# H100 (2026-11-27, float32, the encoder's 17.8k queries x 2 images): forward + backward 1.63 ms with 32 queries and
# 4 warps, 2.23 ms with 64 and 4 (the first default), 2.27-2.28 ms with 2 warps; forward 0.28 ms against 0.43.
BLOCK_Q = 32
NUM_WARPS = 4


def _launch_sizes(value: Tensor, locations: Tensor) -> tuple[tuple[int, int], dict[str, int]]:
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = locations.shape
    grid = (triton.cdiv(queries, BLOCK_Q), batch * heads)
    constants = {
        "HEADS": heads,
        "CHANNELS": channels,
        "LEVELS": levels,
        "POINTS": points,
        "BLOCK_Q": BLOCK_Q,
        "BLOCK_D": triton.next_power_of_2(channels),
        "num_warps": NUM_WARPS,
    }
    return grid, constants


class MSDeformAttnFunction(torch.autograd.Function):
    """``(value, shapes [L, 2] int32, starts [L] int32, locations fp32, weights fp32) -> [B, Q, M, D]``, all
    contiguous and on one device; gradients for value, locations and weights."""

    @staticmethod
    def forward(ctx, value: Tensor, shapes: Tensor, starts: Tensor, locations: Tensor, weights: Tensor) -> Tensor:
        batch, tokens, heads, channels = value.shape
        queries = locations.shape[1]
        output = value.new_empty(batch, queries, heads, channels)
        grid, constants = _launch_sizes(value, locations)
        ms_deform_attn_forward_kernel[grid](
            value, shapes, starts, locations, weights, output, queries, tokens, **constants
        )
        ctx.save_for_backward(value, shapes, starts, locations, weights)
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):
        value, shapes, starts, locations, weights = ctx.saved_tensors
        tokens, queries = value.shape[1], locations.shape[1]
        grad_value = torch.zeros(value.shape, dtype=torch.float32, device=value.device)
        grad_locations = torch.empty_like(locations)
        grad_weights = torch.empty_like(weights)
        grid, constants = _launch_sizes(value, locations)
        ms_deform_attn_backward_kernel[grid](
            value,
            shapes,
            starts,
            locations,
            weights,
            grad_output.contiguous(),
            grad_value,
            grad_locations,
            grad_weights,
            queries,
            tokens,
            **constants,
        )
        return grad_value.to(value.dtype), None, None, grad_locations, grad_weights


@functools.lru_cache(maxsize=64)
def level_tables(sizes: tuple[tuple[int, int], ...], device: torch.device) -> tuple[Tensor, Tensor, int]:
    """``(shapes [L, 2] int32, first token of each level [L] int32, total tokens)`` on ``device``; kept, because a
    copy from host memory to a GPU waits for the work queued before it (once per layer and step otherwise)."""
    starts, total = [], 0
    for height, width in sizes:
        starts.append(total)
        total += height * width
    shapes = torch.tensor(sizes, dtype=torch.int32).view(-1, 2).to(device)
    return shapes, torch.tensor(starts, dtype=torch.int32).to(device), total


def ms_deform_attn_triton(
    value: Tensor,
    spatial_shapes: Sequence[tuple[int, int]],
    sampling_locations: Tensor,
    attention_weights: Tensor,
) -> Tensor:
    """Fused sampling (see the module docstring for the contract); differentiable in value, locations and weights."""
    if value.dtype not in VALUE_DTYPES:
        raise TypeError(f"the fused kernel takes float32, bfloat16 or float16 values, got {value.dtype}")
    batch, tokens, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    if len(spatial_shapes) != levels:
        raise ValueError(f"{len(spatial_shapes)} spatial shapes for locations over {levels} levels")
    sizes = tuple((int(h), int(w)) for h, w in spatial_shapes)
    shapes, starts, expected = level_tables(sizes, value.device)
    if expected != tokens:
        raise ValueError(f"value has {tokens} tokens, the spatial shapes {list(spatial_shapes)} make {expected}")
    if tuple(attention_weights.shape) != (batch, queries, heads, levels, points):
        raise ValueError(f"attention weights {tuple(attention_weights.shape)} do not match the locations")
    output = MSDeformAttnFunction.apply(
        value.contiguous(),
        shapes,
        starts,
        sampling_locations.float().contiguous(),
        attention_weights.float().contiguous(),
    )
    return output.view(batch, queries, heads * channels)
