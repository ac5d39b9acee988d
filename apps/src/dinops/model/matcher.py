"""Hungarian matching of predictions to ground truth with the focal classification cost (DINO's matcher)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dinops.model.box_ops import box_cxcywh_to_xyxy, generalized_box_iou


class HungarianMatcher(nn.Module):
    """One-to-one assignment minimising ``cost_class*focal + cost_bbox*L1 + cost_giou*(-GIoU)`` per image."""

    def __init__(
        self, *, cost_class: float = 2.0, cost_bbox: float = 5.0, cost_giou: float = 2.0, focal_alpha: float = 0.25
    ):
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("all matcher costs are 0")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou
        self.focal_alpha = focal_alpha

    def cost_matrix(self, logits: Tensor, boxes: Tensor, tgt_labels: Tensor, tgt_boxes: Tensor) -> Tensor:
        """logits ``[N, C]``, boxes ``[N, 4]`` cxcywh, targets ``[M]``/``[M, 4]`` -> cost ``[N, M]``."""
        prob = logits.sigmoid()
        alpha, gamma = self.focal_alpha, 2.0
        neg = (1 - alpha) * (prob**gamma) * (-(1 - prob + 1e-8).log())
        pos = alpha * ((1 - prob) ** gamma) * (-(prob + 1e-8).log())
        cost_class = pos[:, tgt_labels] - neg[:, tgt_labels]
        cost_bbox = torch.cdist(boxes, tgt_boxes, p=1)
        cost_giou = -generalized_box_iou(box_cxcywh_to_xyxy(boxes), box_cxcywh_to_xyxy(tgt_boxes))
        return self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou

    @torch.no_grad()
    def forward(self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]]) -> list[tuple[Tensor, Tensor]]:
        """outputs: ``pred_logits`` ``[B, Q, C]``, ``pred_boxes`` ``[B, Q, 4]``; targets: per image ``labels``,
        ``boxes`` (normalised cxcywh). Returns per image (prediction indices, target indices), int64, sorted by
        prediction index, ``min(Q, n_i)`` long."""
        from scipy.optimize import linear_sum_assignment  # lazy: the inference image has no scipy

        batch, queries = outputs["pred_logits"].shape[:2]
        sizes = [len(t["boxes"]) for t in targets]
        if sum(sizes) == 0:
            empty = torch.empty(0, dtype=torch.int64)
            return [(empty, empty) for _ in targets]
        cost = self.cost_matrix(
            outputs["pred_logits"].flatten(0, 1),
            outputs["pred_boxes"].flatten(0, 1),
            torch.cat([t["labels"] for t in targets]),
            torch.cat([t["boxes"] for t in targets]),
        )
        cost = cost.view(batch, queries, -1).cpu()
        indices = [linear_sum_assignment(c[i]) for i, c in enumerate(cost.split(sizes, -1))]
        return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in indices]
