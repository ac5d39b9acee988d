"""Multi-scale deformable attention sampling: two pure-PyTorch implementations and the start-up backend choice.

Contract shared by both implementations::

    value               [B, S, M, D]        S = sum(H_l * W_l) tokens, M heads, D channels per head
    spatial_shapes      [(H_l, W_l), ...]   L levels, in the token order of ``value``
    sampling_locations  [B, Q, M, L, P, 2]  normalised (x, y) in 0..1 of level l's map
    attention_weights   [B, Q, M, L, P]     already softmax-normalised over L*P
    -> output           [B, Q, M*D]

Sampling is bilinear with zero padding and ``align_corners=False`` semantics: a location maps to the pixel
coordinate ``loc * size - 0.5`` and neighbours outside the map contribute 0.

* ``grid_sample``: one ``F.grid_sample`` per level; the formulation of the official pure-PyTorch reference.
* ``gather``: computes the four bilinear neighbours itself, folds bilinear and attention weights together and
  reduces with ``F.embedding_bag`` (one weighted row gather-sum per query and head). It avoids the
  ``[B*M, D, Q, L*P]`` intermediate and is several times faster on CPU over the encoder's ~20k tokens.
  Gradients flow to value, locations and weights.

The backend is chosen once per process and device type (:func:`deformable_attention_backend`) after checking
``gather`` against ``grid_sample`` on random inputs there; :func:`set_deformable_attention_backend` forces one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

SpatialShapes = Sequence[tuple[int, int]]
CoreFn = Callable[[Tensor, SpatialShapes, Tensor, Tensor], Tensor]

_SELF_CHECK_TOLERANCE = 1e-5
_chosen: dict[str, str] = {}  # device type -> backend that passed the self-check there
_forced: str | None = None


def ms_deform_attn_grid_sample(
    value: Tensor, spatial_shapes: SpatialShapes, sampling_locations: Tensor, attention_weights: Tensor
) -> Tensor:
    """Reference implementation with ``F.grid_sample`` per level (see the module docstring for the contract)."""
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    grids = 2 * sampling_locations - 1
    output = value.new_zeros(batch * heads, channels, queries)
    start = 0
    for level, (height, width) in enumerate(spatial_shapes):
        value_l = value[:, start : start + height * width].flatten(2).transpose(1, 2)
        value_l = value_l.reshape(batch * heads, channels, height, width)
        start += height * width
        grid_l = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)  # [B*M, Q, P, 2]
        sampled = F.grid_sample(value_l, grid_l, mode="bilinear", padding_mode="zeros", align_corners=False)
        weights_l = attention_weights[:, :, :, level].transpose(1, 2).reshape(batch * heads, 1, queries, points)
        output = output + (sampled * weights_l).sum(-1)
    return output.view(batch, heads * channels, queries).transpose(1, 2).contiguous()


def _padded_table(value: Tensor, spatial_shapes: SpatialShapes) -> tuple[Tensor, list[int]]:
    """Value rows ``[B*S'*M, D]`` with every level zero-padded by 1 pixel before and 2 after in x and y, so that
    every bilinear tap of a clamped location lands inside the table and out-of-map taps read zeros."""
    batch, _, heads, channels = value.shape
    levels, starts, start, offset = [], [], 0, 0
    for height, width in spatial_shapes:
        level = value[:, start : start + height * width].view(batch, height, width, heads * channels)
        levels.append(F.pad(level, (0, 0, 1, 2, 1, 2)).flatten(1, 2))
        starts.append(offset)
        start += height * width
        offset += (height + 3) * (width + 3)
    table = torch.cat(levels, 1) if len(levels) > 1 else levels[0]
    return table.reshape(-1, channels), starts


def _tap_weights(attention_weights: Tensor, frac: Tensor) -> Tensor:
    """Bilinear times attention weight of the taps (y0x0, y0x1, y1x0, y1x1): ``[..., 2]`` fractions -> ``[..., 4]``."""
    fx, fy = frac[..., 0], frac[..., 1]
    weight_y1 = attention_weights * fy
    weight_y0 = attention_weights - weight_y1
    if torch.is_grad_enabled() and (attention_weights.requires_grad or frac.requires_grad):
        x1_of_y0 = weight_y0 * fx
        x1_of_y1 = weight_y1 * fx
        return torch.stack([weight_y0 - x1_of_y0, x1_of_y0, weight_y1 - x1_of_y1, x1_of_y1], dim=-1)
    # Inference: write the four columns in place, a third fewer passes than stacking (out= has no autograd).
    weights = attention_weights.new_empty(*attention_weights.shape, 4)
    torch.mul(weight_y0, fx, out=weights[..., 1])
    torch.sub(weight_y0, weights[..., 1], out=weights[..., 0])
    torch.mul(weight_y1, fx, out=weights[..., 3])
    torch.sub(weight_y1, weights[..., 3], out=weights[..., 2])
    return weights


def ms_deform_attn_gather(
    value: Tensor, spatial_shapes: SpatialShapes, sampling_locations: Tensor, attention_weights: Tensor
) -> Tensor:
    """Gather-and-sum implementation with ``F.embedding_bag`` (see the module docstring for the contract)."""
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    device = sampling_locations.device
    table, starts = _padded_table(value, spatial_shapes)
    padded_tokens = table.shape[0] // (batch * heads)
    # Per-(level, point) constants, materialised as [L, P, ...] so that every broadcast below runs over
    # contiguous inner blocks of L*P values (much faster on CPU than broadcasting a [L, 1] tensor).
    sizes = torch.tensor([[w, h] for h, w in spatial_shapes], dtype=sampling_locations.dtype, device=device)
    sizes = sizes[:, None].expand(levels, points, 2).contiguous()
    padded_width = torch.tensor([w + 3 for _, w in spatial_shapes], dtype=torch.int32, device=device)
    # Row offset of pixel (0, 0) of each level (1 pixel of padding before it in x and y), in table rows.
    origin = torch.tensor(starts, dtype=torch.int32, device=device) + padded_width + 1
    origin = origin[:, None].expand(levels, points).contiguous()
    step_y = (padded_width * heads)[:, None, None]
    taps = torch.cat([torch.zeros_like(step_y), torch.full_like(step_y, heads), step_y, step_y + heads], -1)
    taps = taps.expand(levels, points, 4).contiguous()  # row offsets of the 4 bilinear taps
    # Pixel coordinates (align_corners=False), clamped to [-1, size]: beyond that every tap is outside the map,
    # and the clamped location still reads only zero padding. On maps ~100 pixels wide float32 rounding of this
    # coordinate alone makes any two implementations differ by ~1e-5 (both are that far from float64).
    pixel = sampling_locations * sizes - 0.5
    pixel = torch.minimum(pixel.clamp_(min=-1.0), sizes)
    corner = pixel.floor()
    frac = pixel.sub_(corner)
    corner = corner.int()
    base = corner[..., 1] * padded_width[:, None] + corner[..., 0] + origin  # [B, Q, M, L, P] token in level
    offset = torch.arange(batch, dtype=torch.int32, device=device).view(batch, 1, 1) * (padded_tokens * heads)
    offset = offset + torch.arange(heads, dtype=torch.int32, device=device).view(1, 1, heads)
    base = (base * heads).add_(offset[..., None, None])
    rows = base[..., None] + taps  # [B, Q, M, L, P, 4]
    rows = rows.clamp_(0, table.shape[0] - 1)  # only NaN locations can leave the table; keep the gather legal
    weights = _tap_weights(attention_weights, frac)
    rows = rows.view(batch * queries * heads, levels * points * 4)
    weights = weights.reshape(batch * queries * heads, levels * points * 4)
    if table.shape[0] >= 2**31:
        rows = rows.long()
    out = F.embedding_bag(rows, table, per_sample_weights=weights.to(table.dtype), mode="sum")
    return out.view(batch, queries, heads * channels)


BACKENDS: dict[str, CoreFn] = {"grid_sample": ms_deform_attn_grid_sample, "gather": ms_deform_attn_gather}


def _self_check(candidate: CoreFn, device: torch.device) -> float:
    """Max abs difference between ``candidate`` and the reference on random inputs with out-of-map samples."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 9), (4, 5), (2, 3)]
    tokens = sum(h * w for h, w in shapes)
    value = torch.randn(2, tokens, 2, 8, generator=gen).to(device)
    locations = (torch.rand(2, 11, 2, len(shapes), 3, 2, generator=gen) * 1.4 - 0.2).to(device)
    weights = torch.rand(2, 11, 2, len(shapes), 3, generator=gen).to(device)
    expected = ms_deform_attn_grid_sample(value, shapes, locations, weights)
    got = candidate(value, shapes, locations, weights)
    return float((expected - got).abs().max())


def deformable_attention_backend(device: str | torch.device = "cpu") -> str:
    """Name of the sampling backend (``gather`` or ``grid_sample``) used on ``device``'s type, chosen on first use
    by checking ``gather`` against ``grid_sample`` there."""
    device = torch.device(device)
    if _forced is not None:
        return _forced
    if device.type not in _chosen:
        try:
            error = _self_check(ms_deform_attn_gather, device)
        except RuntimeError as exc:  # an op missing on this build or device: keep the reference
            log.warning("deformable attention: gather backend failed its self-check on %s (%s)", device.type, exc)
            error = float("inf")
        chosen = "gather" if error <= _SELF_CHECK_TOLERANCE else "grid_sample"
        if chosen == "grid_sample":
            log.warning("deformable attention: gather backend off on %s (self-check error %.3g)", device.type, error)
        log.info("deformable attention backend on %s: %s", device.type, chosen)
        _chosen[device.type] = chosen
    return _chosen[device.type]


def set_deformable_attention_backend(name: str | None) -> None:
    """Force a backend for this process on every device (tests, benchmarks); None returns to the automatic choice."""
    global _forced
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown deformable attention backend {name!r}; use one of {sorted(BACKENDS)}")
    _forced = name


def ms_deform_attn(
    value: Tensor, spatial_shapes: SpatialShapes, sampling_locations: Tensor, attention_weights: Tensor
) -> Tensor:
    """Dispatch to the backend of the tensors' device (see the module docstring for the contract).

    Sampling runs in float32 (or float64) even under autocast: in bfloat16 a pixel coordinate near 100 would be
    rounded to half a pixel.
    """
    backend = BACKENDS[deformable_attention_backend(value.device)]
    if value.dtype in (torch.float32, torch.float64):
        return backend(value, spatial_shapes, sampling_locations.to(value.dtype), attention_weights.to(value.dtype))
    with torch.autocast(value.device.type, enabled=False):
        output = backend(value.float(), spatial_shapes, sampling_locations.float(), attention_weights.float())
    return output.to(value.dtype)
