"""Box operations: pure functions on tensors, no state.

Formats: ``cxcywh`` = (center x, center y, width, height); ``xyxy`` = (x0, y0, x1, y1). Every function works on any
leading shape ``[..., 4]`` unless it says "pairwise" (then ``[N, 4]`` x ``[M, 4]`` -> ``[N, M]``).
"""

from __future__ import annotations

import torch
from torch import Tensor


def box_cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """``[..., 4]`` cxcywh -> ``[..., 4]`` xyxy."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)


def box_xyxy_to_cxcywh(boxes: Tensor) -> Tensor:
    """``[..., 4]`` xyxy -> ``[..., 4]`` cxcywh."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    return torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], dim=-1)


def box_area(boxes: Tensor) -> Tensor:
    """``[..., 4]`` xyxy -> ``[...]`` area (negative for degenerate boxes, as the official code computes it)."""
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def box_iou(boxes1: Tensor, boxes2: Tensor) -> tuple[Tensor, Tensor]:
    """Pairwise IoU and union of xyxy boxes: ``[N, 4]``, ``[M, 4]`` -> (``[N, M]``, ``[N, M]``)."""
    area1 = box_area(boxes1)
    area2 = box_area(boxes2)
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area1[:, None] + area2[None, :] - inter
    return inter / union, union


def generalized_box_iou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """Pairwise generalised IoU of xyxy boxes, ``[N, 4]``, ``[M, 4]`` -> ``[N, M]`` in [-1, 1].

    Degenerate boxes (x1 < x0 or y1 < y0) are rejected: they would give meaningless values silently.
    """
    if not bool((boxes1[:, 2:] >= boxes1[:, :2]).all()) or not bool((boxes2[:, 2:] >= boxes2[:, :2]).all()):
        raise ValueError("generalized_box_iou needs xyxy boxes with x1 >= x0 and y1 >= y0 (got degenerate boxes)")
    iou, union = box_iou(boxes1, boxes2)
    lt = torch.min(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.max(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    enclosing = wh[..., 0] * wh[..., 1]
    return iou - (enclosing - union) / enclosing


def elementwise_generalized_box_iou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """Generalised IoU of matching pairs of xyxy boxes: ``[N, 4]``, ``[N, 4]`` -> ``[N]``.

    Equal to the diagonal of :func:`generalized_box_iou` (the same arithmetic per pair) without the N x N matrix.
    """
    if boxes1.shape != boxes2.shape:
        raise ValueError(f"elementwise_generalized_box_iou needs equal shapes, got {boxes1.shape} and {boxes2.shape}")
    area1 = box_area(boxes1)
    area2 = box_area(boxes2)
    wh = (torch.min(boxes1[:, 2:], boxes2[:, 2:]) - torch.max(boxes1[:, :2], boxes2[:, :2])).clamp(min=0)
    inter = wh[:, 0] * wh[:, 1]
    union = area1 + area2 - inter
    iou = inter / union
    wh = (torch.max(boxes1[:, 2:], boxes2[:, 2:]) - torch.min(boxes1[:, :2], boxes2[:, :2])).clamp(min=0)
    enclosing = wh[:, 0] * wh[:, 1]
    return iou - (enclosing - union) / enclosing


def inverse_sigmoid(x: Tensor, eps: float = 1e-3) -> Tensor:
    """logit(x) with x clamped to [0, 1] and both x and 1 - x clamped to at least ``eps`` (the official rule)."""
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def scale_boxes(boxes_cxcywh: Tensor, sizes_hw: Tensor) -> Tensor:
    """Normalised cxcywh ``[B, N, 4]`` -> absolute xyxy pixels, ``sizes_hw`` ``[B, 2]`` as (h, w); no clamping."""
    h, w = sizes_hw.unbind(1)
    scale = torch.stack([w, h, w, h], dim=1)
    return box_cxcywh_to_xyxy(boxes_cxcywh) * scale[:, None, :]
