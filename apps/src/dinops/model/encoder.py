"""Deformable transformer encoder (post-norm): self-attention of every multi-scale token through MSDeformAttn."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dinops.model.deformable_attention import MSDeformAttn
from dinops.model.layers import activation_fn
from dinops.model.ms_deform_attn_core import SpatialShapes


class DeformableEncoderLayer(nn.Module):
    """``x = norm1(x + attn(x + pos, ref, x)); x = norm2(x + linear2(act(linear1(x))))``."""

    def __init__(
        self, *, d_model: int, d_ffn: int, dropout: float, activation: str, n_levels: int, n_heads: int, n_points: int
    ) -> None:
        super().__init__()
        self.self_attn = MSDeformAttn(d_model=d_model, n_levels=n_levels, n_heads=n_heads, n_points=n_points)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, d_ffn)
        self.activation = activation_fn(activation)
        self.dropout2 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ffn, d_model)
        self.dropout3 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(
        self, src: Tensor, pos: Tensor, reference_points: Tensor, spatial_shapes: SpatialShapes, padding_mask: Tensor
    ) -> Tensor:
        """src, pos ``[B, S, C]``; reference_points ``[B, S, L, 2]``; padding_mask ``[B, S]`` True = padding."""
        attended = self.self_attn(src + pos, reference_points, src, spatial_shapes, padding_mask)
        src = self.norm1(src + self.dropout1(attended))
        ffn = self.linear2(self.dropout2(self.activation(self.linear1(src))))
        return self.norm2(src + self.dropout3(ffn))


def encoder_reference_points(spatial_shapes: SpatialShapes, valid_ratios: Tensor) -> Tensor:
    """Pixel centres of every level, in the valid area's normalised coordinates, seen from every level.

    valid_ratios: ``[B, L, 2]`` as (w, h). Returns ``[B, S, L, 2]`` (x, y).
    """
    refs = []
    for level, (height, width) in enumerate(spatial_shapes):
        ref_y, ref_x = torch.meshgrid(
            torch.linspace(0.5, height - 0.5, height, dtype=torch.float32, device=valid_ratios.device),
            torch.linspace(0.5, width - 0.5, width, dtype=torch.float32, device=valid_ratios.device),
            indexing="ij",
        )
        ref_y = ref_y.reshape(-1)[None] / (valid_ratios[:, None, level, 1] * height)
        ref_x = ref_x.reshape(-1)[None] / (valid_ratios[:, None, level, 0] * width)
        refs.append(torch.stack((ref_x, ref_y), -1))
    return torch.cat(refs, 1)[:, :, None] * valid_ratios[:, None]


class DeformableEncoder(nn.Module):
    """A stack of :class:`DeformableEncoderLayer` with no final norm (keys ``layers.{i}``)."""

    def __init__(self, *, num_layers: int, **layer_kwargs: int | float | str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DeformableEncoderLayer(**layer_kwargs) for _ in range(num_layers))

    def forward(
        self, src: Tensor, pos: Tensor, spatial_shapes: SpatialShapes, valid_ratios: Tensor, padding_mask: Tensor
    ) -> Tensor:
        """src, pos ``[B, S, C]``; valid_ratios ``[B, L, 2]``; padding_mask ``[B, S]`` -> memory ``[B, S, C]``."""
        reference_points = encoder_reference_points(spatial_shapes, valid_ratios)
        for layer in self.layers:
            src = layer(src, pos, reference_points, spatial_shapes, padding_mask)
        return src
