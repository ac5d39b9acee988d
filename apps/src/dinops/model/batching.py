"""Batching images of different sizes the way the official code does."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pad_images(tensors: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Pad ``[3, H_i, W_i]`` images top-left into one zero batch of the per-dimension maximum size.

    No rounding up to a multiple of 32. Returns (images ``[B, 3, H, W]``, mask ``[B, H, W]`` bool, True = padding).
    """
    if len(tensors) == 0:
        raise ValueError("pad_images needs at least one image")
    for i, t in enumerate(tensors):
        if t.dim() != 3:
            raise ValueError(f"image {i} must be [C, H, W], got shape {tuple(t.shape)}")
        if t.shape[0] != tensors[0].shape[0]:
            raise ValueError(f"image {i} has {t.shape[0]} channels, image 0 has {tensors[0].shape[0]}")
    channels = tensors[0].shape[0]
    height = max(int(t.shape[1]) for t in tensors)
    width = max(int(t.shape[2]) for t in tensors)
    first = tensors[0]
    images = torch.zeros(len(tensors), channels, height, width, dtype=first.dtype, device=first.device)
    mask = torch.ones(len(tensors), height, width, dtype=torch.bool, device=first.device)
    for i, t in enumerate(tensors):
        images[i, :, : t.shape[1], : t.shape[2]].copy_(t)
        mask[i, : t.shape[1], : t.shape[2]] = False
    return images, mask
