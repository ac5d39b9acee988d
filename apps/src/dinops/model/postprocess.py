"""Post-processing: top-k over all (query, class) scores and boxes in pixels of the original image."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dinops.model.box_ops import scale_boxes


@torch.no_grad()
def postprocess(
    outputs: dict[str, Any], target_sizes: Tensor, num_select: int = 300, nms_iou_threshold: float = -1
) -> list[dict[str, Tensor]]:
    """Detections per image, as the official PostProcess.

    outputs: ``pred_logits`` ``[B, Q, C]`` and ``pred_boxes`` ``[B, Q, 4]`` (normalised cxcywh).
    target_sizes: ``[B, 2]`` (h, w) of the original images. The ``num_select`` highest ``sigmoid(logits)`` over the
    flattened Q*C values are kept (query = idx // C, label = idx % C). Returns per image ``scores`` ``[K]``,
    ``labels`` ``[K]`` int64 and ``boxes`` ``[K, 4]`` absolute xyxy (not clamped to the image), highest score first.
    With ``nms_iou_threshold > 0`` class-agnostic NMS (torchvision) then drops overlapping boxes.
    """
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
    if target_sizes.shape != (logits.shape[0], 2):
        raise ValueError(
            f"target_sizes must be [B, 2] = [{logits.shape[0]}, 2] (h, w), got {tuple(target_sizes.shape)}"
        )
    batch, queries, classes = logits.shape
    k = min(num_select, queries * classes)
    scores, flat = torch.topk(logits.sigmoid().view(batch, -1), k, dim=1)
    query = torch.div(flat, classes, rounding_mode="floor")
    labels = flat % classes
    pixel_boxes = scale_boxes(boxes, target_sizes.to(boxes.device))
    pixel_boxes = torch.gather(pixel_boxes, 1, query.unsqueeze(-1).repeat(1, 1, 4))
    results = []
    for s, lab, b in zip(scores, labels, pixel_boxes, strict=True):
        if nms_iou_threshold > 0:
            from torchvision.ops import nms

            keep = nms(b, s, iou_threshold=nms_iou_threshold)
            s, lab, b = s[keep], lab[keep], b[keep]
        results.append({"scores": s, "labels": lab, "boxes": b})
    return results
