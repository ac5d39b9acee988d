"""`MSDeformAttn`: multi-scale deformable attention (Deformable DETR), parameter names as in official checkpoints."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dinops.model.ms_deform_attn_core import PreparedValue, SpatialShapes, prepare_value, sample, sample_pixels


class MSDeformAttn(nn.Module):
    """Each query attends to ``n_points`` sampled locations per head and level around its reference point."""

    def __init__(self, *, d_model: int = 256, n_levels: int = 4, n_heads: int = 8, n_points: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_levels = n_levels
        self.n_heads = n_heads
        self.n_points = n_points
        self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: zero offset weights, offset biases on a ring (one direction per head), uniform attention."""
        nn.init.constant_(self.sampling_offsets.weight, 0.0)
        thetas = torch.arange(self.n_heads, dtype=torch.float32) * (2.0 * math.pi / self.n_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = grid / grid.abs().max(-1, keepdim=True)[0]
        grid = grid.view(self.n_heads, 1, 1, 2).repeat(1, self.n_levels, self.n_points, 1)
        grid = grid * torch.arange(1, self.n_points + 1, dtype=torch.float32).view(1, 1, -1, 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.reshape(-1))
        nn.init.constant_(self.attention_weights.weight, 0.0)
        nn.init.constant_(self.attention_weights.bias, 0.0)
        nn.init.xavier_uniform_(self.value_proj.weight)
        nn.init.constant_(self.value_proj.bias, 0.0)
        nn.init.xavier_uniform_(self.output_proj.weight)
        nn.init.constant_(self.output_proj.bias, 0.0)

    def forward(
        self,
        query: Tensor,
        reference_points: Tensor,
        input_flatten: Tensor,
        spatial_shapes: SpatialShapes,
        input_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Attend from queries to the flattened multi-scale map.

        query: ``[B, Q, C]`` (content + position); input_flatten: ``[B, S, C]`` tokens of all levels in the order of
        ``spatial_shapes`` (list of (H, W)); input_padding_mask: ``[B, S]`` bool, True = padding (values zeroed).
        reference_points: ``[B, Q, L, 2]`` normalised (x, y), offsets scale with each level's size; or
        ``[B, Q, L, 4]`` boxes (cx, cy, w, h), offsets scale with the box (``off / n_points * wh * 0.5``).
        Returns ``[B, Q, C]``.
        """
        return self.attend(query, reference_points, self.prepare(input_flatten, spatial_shapes, input_padding_mask))

    def prepare(
        self, input_flatten: Tensor, spatial_shapes: SpatialShapes, input_padding_mask: Tensor | None = None
    ) -> PreparedValue:
        """The projected values of the map, laid out once for any number of :meth:`attend` calls."""
        batch, tokens, _ = input_flatten.shape
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], 0.0)
        value = value.view(batch, tokens, self.n_heads, self.d_model // self.n_heads)
        return prepare_value(value, spatial_shapes, self.n_points)

    def attend(self, query: Tensor, reference_points: Tensor, prepared: PreparedValue) -> Tensor:
        """Queries ``[B, Q, C]`` (all of them or a chunk) with their reference points -> ``[B, Q, C]``."""
        batch, queries, _ = query.shape
        offsets = self.sampling_offsets(query).view(batch, queries, self.n_heads, self.n_levels, self.n_points, 2)
        weights = self.attention_weights(query).view(batch, queries, self.n_heads, self.n_levels * self.n_points)
        weights = F.softmax(weights, -1).view(batch, queries, self.n_heads, self.n_levels, self.n_points)
        if reference_points.shape[-1] == 2:
            shapes = torch.tensor(prepared.spatial_shapes, dtype=query.dtype, device=query.device)
            normalizer = torch.stack([shapes[:, 1], shapes[:, 0]], -1)  # (W, H) per level
            locations = reference_points[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
        elif reference_points.shape[-1] == 4:
            locations = (
                reference_points[:, :, None, :, None, :2]
                + offsets / self.n_points * reference_points[:, :, None, :, None, 2:] * 0.5
            )
        else:
            raise ValueError(f"reference_points must end in 2 or 4 values, got {tuple(reference_points.shape)}")
        return self.output_proj(sample(prepared, locations, weights))

    def attend_pixels(self, query: Tensor, reference_pixels: Tensor, prepared: PreparedValue) -> Tensor:
        """:meth:`attend` for 2-value reference points given as pixel coordinates ``[B, Q, 1, L, P, 2]``
        (``ref * (W_l, H_l) - 0.5``, expanded over the points): the sampling pixel is that plus the offset, which is
        ``(ref + offset / (W_l, H_l)) * (W_l, H_l) - 0.5`` without the division (the encoder's fast path)."""
        batch, queries, _ = query.shape
        offsets = self.sampling_offsets(query).view(batch, queries, self.n_heads, self.n_levels, self.n_points, 2)
        # In place when both are float32; under autocast the offsets are bfloat16 and the sum must be float32, as the
        # reference path's ``ref + offset / size`` is by type promotion (a pixel near 100 in bfloat16 is off by 0.25).
        if offsets.dtype == reference_pixels.dtype:
            pixels = offsets.add_(reference_pixels)
        else:
            pixels = reference_pixels + offsets
        weights = self.attention_weights(query).view(batch, queries, self.n_heads, self.n_levels * self.n_points)
        weights = F.softmax(weights, -1).view(batch, queries, self.n_heads, self.n_levels, self.n_points)
        return self.output_proj(sample_pixels(prepared, pixels, weights))
