"""Triton kernels of the fused multi-scale deformable attention (forward and backward); the autograd wrapper and the
tensor contract are in :mod:`dinops.model.ms_deform_attn_triton`.

One program handles ``BLOCK_Q`` queries of one image and one head, with all ``CHANNELS`` of that head in a row of
``BLOCK_D`` lanes: each bilinear tap is one ``[BLOCK_Q, BLOCK_D]`` gather of contiguous channel rows. Sampling
follows ``F.grid_sample(align_corners=False, padding_mode="zeros")``: a normalised location ``loc`` maps to the
pixel ``loc * size - 0.5``; a tap outside the map reads zero and receives no gradient. Validity is decided in float
before any integer conversion, so NaN or huge locations select no tap. Values may be float32, bfloat16 or float16;
locations, weights and every sum are float32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tap(value_row, x, y, width, height, row_mask, channels, channel_mask):
    """Offsets ``[BLOCK_Q, BLOCK_D]`` of tap (x, y) from a level's first value and the mask of the taps inside the
    map (``value_row``: elements between two tokens, HEADS * CHANNELS)."""
    inside = row_mask & (x >= 0.0) & (x <= width - 1.0) & (y >= 0.0) & (y <= height - 1.0)
    token = tl.where(inside, y, 0.0).to(tl.int64) * width.to(tl.int64) + tl.where(inside, x, 0.0).to(tl.int64)
    offsets = token[:, None] * value_row + channels[None, :]
    return offsets, inside[:, None] & channel_mask[None, :]


@triton.jit
def _pixel(loc_ptr, attn_ptr, sample, row_mask, width, height):
    """Pixel coordinates of sample ``sample`` (``[BLOCK_Q]`` indices into the weights), split into the top-left
    tap (x0, y0) and the fractions (fx, fy), with its attention weight."""
    loc_x = tl.load(loc_ptr + 2 * sample, mask=row_mask, other=0.0)
    loc_y = tl.load(loc_ptr + 2 * sample + 1, mask=row_mask, other=0.0)
    attn = tl.load(attn_ptr + sample, mask=row_mask, other=0.0)
    x = loc_x * width - 0.5
    y = loc_y * height - 0.5
    x0 = tl.floor(x)
    y0 = tl.floor(y)
    return x0, y0, x - x0, y - y0, attn


@triton.jit
def _program_block(
    queries, tokens, HEADS: tl.constexpr, CHANNELS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr
):
    """This program's rows: ``query_head`` ``[BLOCK_Q]`` (rows of ``[B, Q, M]``) with their mask, the channel lanes
    with theirs, the output tile's offsets and mask, and the element offset of its image and head in the values."""
    image = tl.program_id(1) // HEADS
    head = tl.program_id(1) % HEADS
    query = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    row_mask = query < queries
    channels = tl.arange(0, BLOCK_D)
    channel_mask = channels < CHANNELS
    query_head = (image.to(tl.int64) * queries + query) * HEADS + head
    out_offsets = query_head[:, None] * CHANNELS + channels[None, :]
    out_mask = row_mask[:, None] & channel_mask[None, :]
    value_start = (image.to(tl.int64) * tokens * HEADS + head) * CHANNELS
    return query_head, row_mask, channels, channel_mask, out_offsets, out_mask, value_start


@triton.jit
def ms_deform_attn_forward_kernel(
    value_ptr,  # [B, S, M, D] float32 / bfloat16 / float16
    shapes_ptr,  # [L, 2] int32 (H, W)
    starts_ptr,  # [L] int32 first token of each level
    loc_ptr,  # [B, Q, M, L, P, 2] float32
    attn_ptr,  # [B, Q, M, L, P] float32
    out_ptr,  # [B, Q, M, D] value's dtype
    queries,
    tokens,
    HEADS: tl.constexpr,
    CHANNELS: tl.constexpr,
    LEVELS: tl.constexpr,
    POINTS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    block = _program_block(queries, tokens, HEADS, CHANNELS, BLOCK_Q, BLOCK_D)
    query_head, row_mask, channels, channel_mask, out_offsets, out_mask, value_start = block
    first_sample = query_head * (LEVELS * POINTS)
    value_row = HEADS * CHANNELS
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    for level in tl.static_range(LEVELS):
        height = tl.load(shapes_ptr + 2 * level).to(tl.float32)
        width = tl.load(shapes_ptr + 2 * level + 1).to(tl.float32)
        level_value = value_ptr + value_start + tl.load(starts_ptr + level).to(tl.int64) * value_row
        for point in tl.static_range(POINTS):
            sample = first_sample + level * POINTS + point
            x0, y0, fx, fy, attn = _pixel(loc_ptr, attn_ptr, sample, row_mask, width, height)
            for corner in tl.static_range(4):
                dx = corner % 2
                dy = corner // 2
                bilinear = (dx * fx + (1 - dx) * (1.0 - fx)) * (dy * fy + (1 - dy) * (1.0 - fy))
                offsets, mask = _tap(value_row, x0 + dx, y0 + dy, width, height, row_mask, channels, channel_mask)
                tap = tl.load(level_value + offsets, mask=mask, other=0.0).to(tl.float32)
                acc += (attn * bilinear)[:, None] * tap
    tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def ms_deform_attn_backward_kernel(
    value_ptr,
    shapes_ptr,
    starts_ptr,
    loc_ptr,
    attn_ptr,
    grad_out_ptr,  # [B, Q, M, D] any float dtype
    grad_value_ptr,  # [B, S, M, D] float32, zeroed (taps add into it atomically)
    grad_loc_ptr,  # [B, Q, M, L, P, 2] float32
    grad_attn_ptr,  # [B, Q, M, L, P] float32
    queries,
    tokens,
    HEADS: tl.constexpr,
    CHANNELS: tl.constexpr,
    LEVELS: tl.constexpr,
    POINTS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    block = _program_block(queries, tokens, HEADS, CHANNELS, BLOCK_Q, BLOCK_D)
    query_head, row_mask, channels, channel_mask, out_offsets, out_mask, value_start = block
    first_sample = query_head * (LEVELS * POINTS)
    value_row = HEADS * CHANNELS
    grad_out = tl.load(grad_out_ptr + out_offsets, mask=out_mask, other=0.0).to(tl.float32)
    for level in tl.static_range(LEVELS):
        height = tl.load(shapes_ptr + 2 * level).to(tl.float32)
        width = tl.load(shapes_ptr + 2 * level + 1).to(tl.float32)
        level_start = value_start + tl.load(starts_ptr + level).to(tl.int64) * value_row
        for point in tl.static_range(POINTS):
            sample = first_sample + level * POINTS + point
            x0, y0, fx, fy, attn = _pixel(loc_ptr, attn_ptr, sample, row_mask, width, height)
            grad_attn = tl.zeros((BLOCK_Q,), dtype=tl.float32)
            grad_x = tl.zeros((BLOCK_Q,), dtype=tl.float32)
            grad_y = tl.zeros((BLOCK_Q,), dtype=tl.float32)
            for corner in tl.static_range(4):
                dx = corner % 2
                dy = corner // 2
                weight_x = dx * fx + (1 - dx) * (1.0 - fx)
                weight_y = dy * fy + (1 - dy) * (1.0 - fy)
                offsets, mask = _tap(value_row, x0 + dx, y0 + dy, width, height, row_mask, channels, channel_mask)
                tap = tl.load(value_ptr + level_start + offsets, mask=mask, other=0.0).to(tl.float32)
                # sum over channels of grad_out * tap: the sampled value's share of d(out)/d(this tap's weight)
                projected = tl.sum(grad_out * tap, axis=1)
                grad_attn += weight_x * weight_y * projected
                # d(bilinear)/dx = +-weight_y (sign of the x side), likewise in y
                grad_x += (2 * dx - 1) * weight_y * projected
                grad_y += (2 * dy - 1) * weight_x * projected
                contribution = (attn * weight_x * weight_y)[:, None] * grad_out
                tl.atomic_add(grad_value_ptr + level_start + offsets, contribution, mask=mask, sem="relaxed")
            tl.store(grad_attn_ptr + sample, grad_attn, mask=row_mask)
            tl.store(grad_loc_ptr + 2 * sample, grad_x * attn * width, mask=row_mask)
            tl.store(grad_loc_ptr + 2 * sample + 1, grad_y * attn * height, mask=row_mask)
