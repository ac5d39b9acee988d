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

* ``triton``: the fused Triton kernel of :mod:`dinops.model.ms_deform_attn_triton` (forward and backward in one
  kernel each, values read in their own dtype); the default on CUDA devices.

The backend is chosen once per process and device type (:func:`deformable_attention_backend`) after checking it
against ``grid_sample`` on random inputs there: ``triton`` on CUDA devices when it passes
(``DINO_DEFORM_ATTN=auto``); otherwise ``gather`` when it passes, else ``grid_sample``. ``DINO_DEFORM_ATTN=pure``
never uses the kernel; ``triton`` uses it on every device or fails (CPU tensors need ``TRITON_INTERPRET=1``).
:func:`set_deformable_attention_backend` forces one backend in a process.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from dinops.settings import Setting, resolve

log = logging.getLogger(__name__)

SpatialShapes = Sequence[tuple[int, int]]
CoreFn = Callable[[Tensor, SpatialShapes, Tensor, Tensor], Tensor]

_SELF_CHECK_TOLERANCE = 1e-5
FLOAT_ROWS_LIMIT = 2**24  # table rows are computed in float below this: every integer up to 2**24 is exact in float32
_chosen: dict[str, str] = {}  # device type -> backend that passed the self-check there
_forced: str | None = None
DEFORM_ATTN = Setting(
    "deform_attn",
    "auto",
    "deformable attention sampling: auto (fused Triton kernel on CUDA GPUs, pure PyTorch elsewhere), triton or pure",
    env="DINO_DEFORM_ATTN",
    choices=("auto", "triton", "pure"),
)


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


@dataclass(frozen=True)
class SamplingTable:
    """``value`` laid out once for the gather backend, so that several sampling calls (the encoder's token chunks)
    share it and its per-level constants.

    ``table``: rows ``[B*S'*M, D]`` of the zero-padded levels (:func:`_padded_table`). The constants are
    materialised as ``[L, P, ...]`` so that every broadcast runs over contiguous inner blocks of L*P values (much
    faster on CPU than broadcasting a ``[L, 1]`` tensor): ``sizes`` (W, H), ``padded_width`` ``[L, 1]``, ``origin``
    (the row of pixel (0, 0) of each level, 1 pixel of padding before it in x and y) and ``taps`` (row offsets of the
    4 bilinear neighbours).
    """

    table: Tensor
    batch: int
    heads: int
    channels: int
    sizes: Tensor
    padded_width: Tensor
    origin: Tensor
    taps: Tensor
    rows_per_y: Tensor  # [L, P] padded_width * heads, in the sampling dtype
    _rows_origin: dict[int, Tensor] = field(default_factory=dict, compare=False)

    def rows_origin(self, padded_tokens: int) -> Tensor:
        """``[B, 1, M, L, P]`` (sampling dtype): the table row of pixel (0, 0) of each image, head and level."""
        if padded_tokens not in self._rows_origin:
            image = torch.arange(self.batch, device=self.origin.device).view(-1, 1, 1, 1, 1) * (
                padded_tokens * self.heads
            )
            head = torch.arange(self.heads, device=self.origin.device).view(1, 1, -1, 1, 1)
            origin = (self.origin * self.heads).view(1, 1, 1, *self.origin.shape)
            self._rows_origin[padded_tokens] = (image + head + origin).to(self.rows_per_y.dtype)
        return self._rows_origin[padded_tokens]


def gather_table(value: Tensor, spatial_shapes: SpatialShapes, points: int) -> SamplingTable:
    """Lay ``value [B, S, M, D]`` out for :func:`gather_from_table` with ``points`` samples per head and level."""
    batch, _, heads, channels = value.shape
    levels, device = len(spatial_shapes), value.device
    table, starts = _padded_table(value, spatial_shapes)
    sizes = torch.tensor([[w, h] for h, w in spatial_shapes], dtype=value.dtype, device=device)
    sizes = sizes[:, None].expand(levels, points, 2).contiguous()
    padded_width = torch.tensor([w + 3 for _, w in spatial_shapes], dtype=torch.int32, device=device)
    origin = torch.tensor(starts, dtype=torch.int32, device=device) + padded_width + 1
    origin = origin[:, None].expand(levels, points).contiguous()
    step_y = (padded_width * heads)[:, None, None]
    taps = torch.cat([torch.zeros_like(step_y), torch.full_like(step_y, heads), step_y, step_y + heads], -1)
    taps = taps.expand(levels, points, 4).contiguous()
    rows_per_y = (padded_width * heads)[:, None].expand(levels, points).to(value.dtype).contiguous()
    return SamplingTable(table, batch, heads, channels, sizes, padded_width[:, None], origin, taps, rows_per_y)


def ms_deform_attn_gather(
    value: Tensor, spatial_shapes: SpatialShapes, sampling_locations: Tensor, attention_weights: Tensor
) -> Tensor:
    """Gather-and-sum implementation with ``F.embedding_bag`` (see the module docstring for the contract)."""
    prepared = gather_table(value, spatial_shapes, sampling_locations.shape[4])
    return gather_from_table(prepared, sampling_locations, attention_weights)


def gather_from_table(prepared: SamplingTable, sampling_locations: Tensor, attention_weights: Tensor) -> Tensor:
    """Sample a :class:`SamplingTable`: locations ``[B, Q, M, L, P, 2]``, weights ``[B, Q, M, L, P]`` ->
    ``[B, Q, M*D]``. Q may be any number of queries (a chunk of the encoder's tokens)."""
    # Pixel coordinates (align_corners=False). On maps ~100 pixels wide float32 rounding of this coordinate alone
    # makes any two implementations differ by ~1e-5 (both are that far from float64).
    return gather_pixels(prepared, sampling_locations * prepared.sizes - 0.5, attention_weights)


def gather_pixels(prepared: SamplingTable, pixels: Tensor, attention_weights: Tensor) -> Tensor:
    """:func:`gather_from_table` with the locations given as pixel coordinates ``loc * (W, H) - 0.5`` of each level
    (``[B, Q, M, L, P, 2]``, overwritten)."""
    table, batch, heads, channels = prepared.table, prepared.batch, prepared.heads, prepared.channels
    sizes, padded_width, origin, taps = prepared.sizes, prepared.padded_width, prepared.origin, prepared.taps
    _, queries, _, levels, points, _ = pixels.shape
    device = pixels.device
    padded_tokens = table.shape[0] // (batch * heads)
    # Clamped to [-1, size]: beyond that every tap is outside the map, and the clamped location still reads only
    # zero padding.
    pixel = pixels.clamp_(min=-1.0)
    pixel = torch.minimum(pixel, sizes) if pixel.requires_grad else torch.minimum(pixel, sizes, out=pixel)
    corner = pixel.floor()
    frac = pixel.sub_(corner)
    # Table row of each sample's top-left tap: (y * padded_width + x + origin) * heads + head + image offset.
    if table.shape[0] < FLOAT_ROWS_LIMIT and pixel.dtype in (torch.float32, torch.float64):
        rows_origin = prepared.rows_origin(padded_tokens)
        base = torch.addcmul(rows_origin, corner[..., 1], prepared.rows_per_y).add_(corner[..., 0], alpha=heads)
        base = base.nan_to_num_(nan=0.0).int()  # a NaN location samples row 0 with NaN weights: NaN, as grid_sample
    else:
        corner = corner.int()
        base = corner[..., 1] * padded_width + corner[..., 0] + origin  # [B, Q, M, L, P] token in level
        offset = torch.arange(batch, dtype=torch.int32, device=device).view(batch, 1, 1) * (padded_tokens * heads)
        offset = offset + torch.arange(heads, dtype=torch.int32, device=device).view(1, 1, heads)
        base = (base * heads).add_(offset[..., None, None])
    rows = base[..., None] + taps  # [B, Q, M, L, P, 4]
    if table.shape[0] >= FLOAT_ROWS_LIMIT:
        rows = rows.clamp_(0, table.shape[0] - 1)  # only NaN locations can leave the table; keep the gather legal
    weights = _tap_weights(attention_weights, frac)
    rows = rows.view(batch * queries * heads, levels * points * 4)
    weights = weights.reshape(batch * queries * heads, levels * points * 4)
    if table.shape[0] >= 2**31:
        rows = rows.long()
    out = F.embedding_bag(rows, table, per_sample_weights=weights.to(table.dtype), mode="sum")
    return out.view(batch, queries, heads * channels)


def ms_deform_attn_fused(
    value: Tensor, spatial_shapes: SpatialShapes, sampling_locations: Tensor, attention_weights: Tensor
) -> Tensor:
    """The Triton kernel, imported on first use (importing Triton takes seconds and it may be absent)."""
    from dinops.model.ms_deform_attn_triton import ms_deform_attn_triton

    return ms_deform_attn_triton(value, spatial_shapes, sampling_locations, attention_weights)


BACKENDS: dict[str, CoreFn] = {
    "grid_sample": ms_deform_attn_grid_sample,
    "gather": ms_deform_attn_gather,
    "triton": ms_deform_attn_fused,
}


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


def _fused_passes(device: torch.device, mode: str) -> bool:
    """Whether the fused kernel runs on ``device`` and matches the reference there (``mode`` from DINO_DEFORM_ATTN)."""
    if mode == "pure" or (mode == "auto" and device.type != "cuda"):
        return False
    try:
        error = _self_check(ms_deform_attn_fused, device)
    except Exception as exc:  # Triton absent, or it cannot compile or launch here: any failure means the pure path
        if mode == "triton":
            raise RuntimeError(f"DINO_DEFORM_ATTN=triton: the fused kernel fails on {device.type}: {exc}") from exc
        log.warning("deformable attention: fused kernel unusable on %s (%s)", device.type, exc)
        return False
    if error > _SELF_CHECK_TOLERANCE:
        if mode == "triton":
            raise RuntimeError(f"DINO_DEFORM_ATTN=triton: the fused kernel is off by {error:.3g} on {device.type}")
        log.warning("deformable attention: fused kernel off on %s (self-check error %.3g)", device.type, error)
    return error <= _SELF_CHECK_TOLERANCE


def deformable_attention_backend(device: str | torch.device = "cpu") -> str:
    """Name of the sampling backend (``triton``, ``gather`` or ``grid_sample``) used on ``device``'s type, chosen on
    first use by checking it against ``grid_sample`` there (see the module docstring)."""
    device = torch.device(device)
    if _forced is not None:
        return _forced
    if device.type not in _chosen and _fused_passes(device, resolve(argparse.Namespace(), (DEFORM_ATTN,)).deform_attn):
        log.info("deformable attention backend on %s: triton", device.type)
        _chosen[device.type] = "triton"
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


@dataclass(frozen=True)
class PreparedValue:
    """``value`` ready for one or more :func:`sample` calls with the backend of its device: the gather backend's
    :class:`SamplingTable` is built once, so the encoder's token chunks share it. ``dtype`` is the caller's value
    dtype (the output's); sampling itself runs in float32 or float64."""

    backend: str
    value: Tensor
    spatial_shapes: list[tuple[int, int]]
    dtype: torch.dtype
    table: SamplingTable | None


FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def prepare_value(value: Tensor, spatial_shapes: SpatialShapes, points: int) -> PreparedValue:
    """Lay out ``value [B, S, M, D]`` for :func:`sample` with ``points`` samples per head and level."""
    backend = deformable_attention_backend(value.device)
    dtype = value.dtype
    if backend == "triton" and dtype not in FUSED_DTYPES:  # float64: the kernel sums in float32
        backend = "grid_sample"
    if backend != "triton" and dtype not in (torch.float32, torch.float64):
        value = value.float()  # the fused kernel reads bfloat16 and float16 values itself
    shapes = [(int(h), int(w)) for h, w in spatial_shapes]
    table = gather_table(value, shapes, points) if backend == "gather" else None
    return PreparedValue(backend, value, shapes, dtype, table)


def sample(prepared: PreparedValue, sampling_locations: Tensor, attention_weights: Tensor) -> Tensor:
    """Sample ``prepared`` at ``[B, Q, M, L, P, 2]`` locations with ``[B, Q, M, L, P]`` weights -> ``[B, Q, M*D]``
    in the prepared value's dtype. Q is any number of queries (all of them, or a chunk)."""
    return _sample(prepared, attention_weights, locations=sampling_locations)


def sample_pixels(prepared: PreparedValue, pixels: Tensor, attention_weights: Tensor) -> Tensor:
    """:func:`sample` with the locations as pixel coordinates ``loc * (W_l, H_l) - 0.5`` (``[B, Q, M, L, P, 2]``;
    the encoder's fast path adds the offsets to pixel references it computed once)."""
    return _sample(prepared, attention_weights, pixels=pixels)


def _sample(
    prepared: PreparedValue, weights: Tensor, *, locations: Tensor | None = None, pixels: Tensor | None = None
) -> Tensor:
    # The fused kernel reads the value in its own dtype, locations and weights in float32.
    compute = torch.float32 if prepared.backend == "triton" else prepared.value.dtype
    weights = weights.to(compute)
    with torch.autocast(prepared.value.device.type, enabled=False):
        if prepared.table is not None and pixels is not None:
            output = gather_pixels(prepared.table, pixels.to(compute), weights)
        elif prepared.table is not None:
            output = gather_from_table(prepared.table, locations.to(compute), weights)
        else:
            if locations is None:
                sizes = torch.tensor([[w, h] for h, w in prepared.spatial_shapes], dtype=compute, device=weights.device)
                locations = (pixels.to(compute) + 0.5) / sizes[:, None]
            backend = BACKENDS[prepared.backend]
            output = backend(prepared.value, prepared.spatial_shapes, locations.to(compute), weights)
    return output.to(prepared.dtype)


def ms_deform_attn(
    value: Tensor, spatial_shapes: SpatialShapes, sampling_locations: Tensor, attention_weights: Tensor
) -> Tensor:
    """Dispatch to the backend of the tensors' device (see the module docstring for the contract).

    Sampling runs in float32 (or float64) even under autocast: in bfloat16 a pixel coordinate near 100 would be
    rounded to half a pixel.
    """
    return sample(
        prepare_value(value, spatial_shapes, sampling_locations.shape[4]), sampling_locations, attention_weights
    )
