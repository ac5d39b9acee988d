"""Sine position encodings: the 2-d one for feature maps and the per-box one for decoder queries."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _sine_features(coord: Tensor, num_feats: int, temperature: float) -> Tensor:
    """``[...]`` scaled coordinate -> ``[..., num_feats]`` interleaved (sin, cos) at geometric frequencies."""
    dim_t = torch.arange(num_feats, dtype=torch.float32, device=coord.device)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / num_feats)
    angles = coord[..., None] / dim_t
    return torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), dim=-1).flatten(-2)


def sine_position_embedding(
    mask: Tensor, num_pos_feats: int, temperature_h: float, temperature_w: float, eps: float = 1e-6
) -> Tensor:
    """Position encoding of a padded feature map.

    mask: ``[B, H, W]`` bool, True = padding. Positions count valid pixels from 1 and are normalised by the valid
    extent of their row/column (the last cumsum value) times 2*pi. Returns ``[B, 2*num_pos_feats, H, W]`` float32:
    channels ``[0, num_pos_feats)`` encode y, the rest x.
    """
    not_mask = ~mask
    y = not_mask.cumsum(1, dtype=torch.float32)
    x = not_mask.cumsum(2, dtype=torch.float32)
    y = y / (y[:, -1:, :] + eps) * (2 * math.pi)
    x = x / (x[:, :, -1:] + eps) * (2 * math.pi)
    pos_y = _sine_features(y, num_pos_feats, temperature_h)
    pos_x = _sine_features(x, num_pos_feats, temperature_w)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


class PositionEmbeddingSineHW(nn.Module):
    """Parameter-free module form of :func:`sine_position_embedding` (separate temperatures for y and x)."""

    def __init__(self, *, num_pos_feats: int, temperature_h: float, temperature_w: float) -> None:
        super().__init__()
        self.num_pos_feats = num_pos_feats
        self.temperature_h = temperature_h
        self.temperature_w = temperature_w

    def forward(self, mask: Tensor) -> Tensor:
        """``[B, H, W]`` bool (True = padding) -> ``[B, 2*num_pos_feats, H, W]``."""
        return sine_position_embedding(mask, self.num_pos_feats, self.temperature_h, self.temperature_w)


def box_sine_embedding(boxes: Tensor, num_feats: int, temperature: float = 10000.0) -> Tensor:
    """Sine embedding of normalised boxes for the decoder's query position.

    boxes: ``[..., 4]`` (cx, cy, w, h) or ``[..., 2]`` (cx, cy) in 0..1. Returns ``[..., k*num_feats]`` with the
    coordinates in the order (y, x, w, h), each scaled by 2*pi, no normalisation.
    """
    scaled = boxes * (2 * math.pi)
    parts = [
        _sine_features(scaled[..., 1], num_feats, temperature),
        _sine_features(scaled[..., 0], num_feats, temperature),
    ]
    if boxes.shape[-1] == 4:
        parts += [
            _sine_features(scaled[..., 2], num_feats, temperature),
            _sine_features(scaled[..., 3], num_feats, temperature),
        ]
    elif boxes.shape[-1] != 2:
        raise ValueError(f"box_sine_embedding needs [..., 2] or [..., 4] boxes, got {tuple(boxes.shape)}")
    return torch.cat(parts, dim=-1)
