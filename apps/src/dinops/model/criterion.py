"""DINO's set criterion: focal classification, L1 and GIoU box losses on matched pairs, for the final layer,
every auxiliary layer (``_0``..``_{n-2}``), the two-stage proposals (``_interm``) and the denoising queries (``_dn``).

Loss names and values follow the official implementation, including its unweighted log entries (``loss_xy``,
``loss_hw``, ``cardinality_error``, ``class_error``) and the zero ``*_dn`` entries when denoising is off.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dinops.model.box_ops import box_cxcywh_to_xyxy, elementwise_generalized_box_iou
from dinops.model.matcher import HungarianMatcher

Indices = list[tuple[Tensor, Tensor]]
_LOG_ONLY_DN = ("loss_bbox", "loss_giou", "loss_ce", "loss_xy", "loss_hw", "cardinality_error")


def sigmoid_focal_loss(
    logits: Tensor, targets: Tensor, num_boxes: float, alpha: float = 0.25, gamma: float = 2
) -> Tensor:
    """Focal loss summed over classes, averaged over queries, summed over the batch, divided by ``num_boxes``."""
    prob = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = prob * targets + (1 - prob) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return loss.mean(1).sum() / num_boxes


def official_weight_dict(
    *,
    cls_loss_coef: float,
    bbox_loss_coef: float,
    giou_loss_coef: float,
    use_dn: bool,
    aux_layers: int,
    two_stage: bool,
    interm_loss_coef: float = 1.0,
    no_interm_box_loss: bool = False,
) -> dict[str, float]:
    """The official loss weights: final, ``_dn``, aux ``_{i}`` (with their ``_dn``) and ``_interm`` terms."""
    base = {"loss_ce": cls_loss_coef, "loss_bbox": bbox_loss_coef, "loss_giou": giou_loss_coef}
    weights = dict(base)
    if use_dn:
        weights.update({f"{k}_dn": v for k, v in base.items()})
    per_layer = dict(weights)
    for i in range(aux_layers):
        weights.update({f"{k}_{i}": v for k, v in per_layer.items()})
    if two_stage:
        box_factor = 0.0 if no_interm_box_loss else 1.0
        factors = {"loss_ce": 1.0, "loss_bbox": box_factor, "loss_giou": box_factor}
        weights.update({f"{k}_interm": v * interm_loss_coef * factors[k] for k, v in base.items()})
    return weights


class SetCriterion(nn.Module):
    """``criterion(outputs, targets) -> dict`` of losses; total = ``sum(l[k] * weight_dict[k] for k in l if k in
    weight_dict)``. targets: per image ``labels`` ``[n]`` int64 and ``boxes`` ``[n, 4]`` normalised cxcywh."""

    def __init__(
        self, *, num_classes: int, matcher: HungarianMatcher, weight_dict: dict[str, float], focal_alpha: float
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = matcher
        self.weight_dict = weight_dict
        self.focal_alpha = focal_alpha

    @staticmethod
    def _src_index(indices: Indices) -> tuple[Tensor, Tensor]:
        batch_idx = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
        return batch_idx, torch.cat([src for src, _ in indices])

    def loss_labels(
        self,
        outputs: dict[str, Tensor],
        targets: list[dict[str, Tensor]],
        indices: Indices,
        num_boxes: float,
        log: bool = True,
    ) -> dict[str, Tensor]:
        """Sigmoid focal loss against one-hot targets (unmatched queries: all zeros), times the query count."""
        logits = outputs["pred_logits"]
        idx = self._src_index(indices)
        matched = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices, strict=True)]).to(logits.device)
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        target_classes[idx] = matched
        onehot = torch.zeros(
            logits.shape[0], logits.shape[1], logits.shape[2] + 1, dtype=logits.dtype, device=logits.device
        )
        onehot.scatter_(2, target_classes.unsqueeze(-1), 1)
        losses = {
            "loss_ce": sigmoid_focal_loss(logits, onehot[:, :, :-1], num_boxes, alpha=self.focal_alpha)
            * logits.shape[1]
        }
        if log:
            if len(matched):
                correct = (logits[idx].argmax(-1) == matched).float().mean() * 100
                losses["class_error"] = 100 - correct
            else:
                losses["class_error"] = torch.full((), 100.0, device=logits.device)
        return losses

    def loss_cardinality(
        self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]], indices: Indices, num_boxes: float
    ) -> dict[str, Tensor]:
        """Logged only: |#queries whose argmax is not the last class - #targets| (a DETR leftover)."""
        logits = outputs["pred_logits"]
        lengths = torch.as_tensor([len(t["labels"]) for t in targets], device=logits.device)
        predicted = (logits.argmax(-1) != logits.shape[-1] - 1).sum(1)
        return {"cardinality_error": F.l1_loss(predicted.float(), lengths.float())}

    def loss_boxes(
        self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]], indices: Indices, num_boxes: float
    ) -> dict[str, Tensor]:
        """L1 and 1 - GIoU of matched pairs, each summed and divided by ``num_boxes``."""
        idx = self._src_index(indices)
        src = outputs["pred_boxes"][idx]
        tgt = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices, strict=True)], dim=0).to(src.device)
        l1 = F.l1_loss(src, tgt, reduction="none")
        giou = elementwise_generalized_box_iou(box_cxcywh_to_xyxy(src), box_cxcywh_to_xyxy(tgt))
        with torch.no_grad():
            xy = l1[..., :2].sum() / num_boxes
            hw = l1[..., 2:].sum() / num_boxes
        return {
            "loss_bbox": l1.sum() / num_boxes,
            "loss_giou": (1 - giou).sum() / num_boxes,
            "loss_xy": xy,
            "loss_hw": hw,
        }

    def _all_losses(
        self,
        outputs: dict[str, Tensor],
        targets: list[dict[str, Tensor]],
        indices: Indices,
        num_boxes: float,
        log: bool,
    ) -> dict[str, Tensor]:
        losses = self.loss_labels(outputs, targets, indices, num_boxes, log=log)
        losses.update(self.loss_boxes(outputs, targets, indices, num_boxes))
        losses.update(self.loss_cardinality(outputs, targets, indices, num_boxes))
        return losses

    @staticmethod
    def _dn_indices(targets: list[dict[str, Tensor]], group_size: int, groups: int) -> Indices:
        """Positive denoising query of each target in each group: slot ``g * group_size + t``."""
        indices = []
        for target in targets:
            count = len(target["labels"])
            tgt = torch.arange(count, dtype=torch.int64).unsqueeze(0).repeat(groups, 1)
            src = (torch.arange(groups, dtype=torch.int64) * group_size).unsqueeze(1) + tgt
            indices.append((src.flatten(), tgt.flatten()))
        return indices

    def forward(self, outputs: dict[str, Any], targets: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        """Losses for the model outputs (see :meth:`dinops.model.detector.DINO.forward`)."""
        logits = outputs["pred_logits"]
        device = logits.device
        num_boxes = max(float(sum(len(t["labels"]) for t in targets)), 1.0)
        zero = torch.zeros((), device=device)
        dn_meta = outputs.get("dn_meta")
        dn = None
        if self.training and dn_meta and "output_known_lbs_bboxes" in dn_meta:
            groups, pad_size = dn_meta["num_dn_group"], dn_meta["pad_size"]
            if pad_size % groups:
                raise ValueError(f"dn_meta pad_size={pad_size} is not a multiple of num_dn_group={groups}")
            dn = (dn_meta["output_known_lbs_bboxes"], self._dn_indices(targets, pad_size // groups, groups), groups)

        def dn_losses(suffix: str, layer: int | None) -> dict[str, Tensor]:
            if dn is None:
                return {f"{k}_dn{suffix}": zero for k in _LOG_ONLY_DN}
            known, dn_idx, groups = dn
            part = known if layer is None else known["aux_outputs"][layer]
            terms = self._all_losses(part, targets, dn_idx, num_boxes * groups, log=False)
            return {f"{k}_dn{suffix}": v for k, v in terms.items()}

        losses = dn_losses("", None)
        final = {k: v for k, v in outputs.items() if k != "aux_outputs"}
        losses.update(self._all_losses(final, targets, self.matcher(final, targets), num_boxes, log=True))
        for layer, aux in enumerate(outputs.get("aux_outputs", [])):
            terms = self._all_losses(aux, targets, self.matcher(aux, targets), num_boxes, log=False)
            losses.update({f"{k}_{layer}": v for k, v in terms.items()})
            losses.update(dn_losses(f"_{layer}", layer))
        if "interm_outputs" in outputs:
            interm = outputs["interm_outputs"]
            terms = self._all_losses(interm, targets, self.matcher(interm, targets), num_boxes, log=False)
            losses.update({f"{k}_interm": v for k, v in terms.items()})
        return losses


def weighted_total(losses: dict[str, Tensor], weight_dict: dict[str, float]) -> Tensor:
    """``sum(losses[k] * weight_dict[k])`` over the weighted terms, as the official training loop sums them."""
    return sum(losses[k] * weight_dict[k] for k in losses if k in weight_dict)
