"""Contrastive denoising (CDN) queries: noised ground truth fed to the decoder during training.

Layout of the ``pad_size = max_gt * 2 * groups`` denoising queries of every image: ``2 * groups`` blocks of
``max_gt`` slots; block ``2g`` holds group g's positive copies of the image's boxes, block ``2g + 1`` the negative
ones (more box noise); unused slots stay zero (label embedding 0, box logit 0). The attention mask lets every
group see itself and the matching queries, and the matching queries see no denoising query.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dinops.model.box_ops import inverse_sigmoid


def dn_group_count(dn_number: int, max_gt: int) -> int:
    """Number of denoising groups, the official rule: ``2 * dn_number``, or ``2*dn_number // (2*max_gt)`` if >= 100."""
    groups = dn_number * 2
    if max_gt == 0:
        return 1
    if groups >= 100:
        groups = groups // (2 * max_gt)
    return max(groups, 1)


def denoising_attn_mask(pad_size: int, num_queries: int, group_size: int, device: torch.device) -> Tensor:
    """``[pad+Q, pad+Q]`` bool, True = may not attend: matching queries never see denoising queries, groups
    (``group_size`` = 2 * max_gt consecutive queries) never see each other."""
    size = pad_size + num_queries
    mask = torch.zeros(size, size, dtype=torch.bool, device=device)
    mask[pad_size:, :pad_size] = True
    if pad_size:
        group = torch.arange(pad_size, device=device) // group_size
        mask[:pad_size, :pad_size] = group[:, None] != group[None, :]
    return mask


def _noise_boxes(boxes: Tensor, negative_idx: Tensor, box_noise_scale: float) -> Tensor:
    """Jitter the corners of cxcywh boxes by up to half their size (positives) or 1-2 halves (negatives)."""
    corners = torch.cat([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], dim=1)
    half = torch.cat([boxes[:, 2:] / 2, boxes[:, 2:] / 2], dim=1)
    rand_sign = torch.randint_like(boxes, low=0, high=2, dtype=torch.float32) * 2.0 - 1.0
    rand_part = torch.rand_like(boxes)
    rand_part[negative_idx] += 1.0
    rand_part *= rand_sign
    corners = (corners + rand_part * half * box_noise_scale).clamp(min=0.0, max=1.0)
    return torch.cat([(corners[:, :2] + corners[:, 2:]) / 2, corners[:, 2:] - corners[:, :2]], dim=1)


def prepare_for_cdn(
    *,
    targets: list[dict[str, Tensor]],
    dn_number: int,
    label_noise_ratio: float,
    box_noise_scale: float,
    num_queries: int,
    num_classes: int,
    hidden_dim: int,
    label_enc: nn.Embedding,
) -> tuple[Tensor, Tensor, Tensor, dict[str, Any]]:
    """Build the denoising queries for one batch.

    targets: per image ``labels`` ``[n_i]`` int64 and ``boxes`` ``[n_i, 4]`` normalised cxcywh.
    Returns (label queries ``[B, pad, hidden_dim]``, box queries ``[B, pad, 4]`` in logit space,
    attention mask ``[pad+Q, pad+Q]``, ``dn_meta`` = {``pad_size``, ``num_dn_group``}).
    Noise uses the global RNG in the official order; a ratio/scale of 0 skips it entirely.
    """
    device = label_enc.weight.device
    counts = [len(t["labels"]) for t in targets]
    max_gt = max(counts, default=0)
    groups = dn_group_count(dn_number, max_gt)
    copies = 2 * groups
    labels = torch.cat([t["labels"] for t in targets]).to(device)
    boxes = torch.cat([t["boxes"] for t in targets]).to(device)
    batch_idx = torch.cat([torch.full_like(t["labels"].long(), i) for i, t in enumerate(targets)]).to(device)
    total = len(labels)
    known_labels = labels.repeat(copies, 1).view(-1)
    known_bid = batch_idx.repeat(copies, 1).view(-1)
    known_boxes = boxes.repeat(copies, 1)
    noisy_labels = known_labels.clone()
    noisy_boxes = known_boxes.clone()
    if label_noise_ratio > 0:
        p = torch.rand_like(noisy_labels.float())
        chosen = torch.nonzero(p < (label_noise_ratio * 0.5)).view(-1)
        noisy_labels.scatter_(0, chosen, torch.randint_like(chosen, 0, num_classes))
    pad_size = max_gt * 2 * groups
    positive_idx = torch.arange(total, device=device).unsqueeze(0).repeat(groups, 1)
    positive_idx = (positive_idx + (torch.arange(groups, device=device) * total * 2).unsqueeze(1)).flatten()
    if box_noise_scale > 0:
        noisy_boxes = _noise_boxes(known_boxes, positive_idx + total, box_noise_scale)
    label_embed = label_enc(noisy_labels.long())
    box_embed = inverse_sigmoid(noisy_boxes)
    batch = len(targets)
    query_label = torch.zeros(batch, pad_size, hidden_dim, device=device, dtype=label_embed.dtype)
    query_box = torch.zeros(batch, pad_size, 4, device=device, dtype=box_embed.dtype)
    if total:
        slot = torch.cat([torch.arange(n, device=device) for n in counts])
        slot = torch.cat([slot + max_gt * i for i in range(copies)])
        query_label = query_label.index_put((known_bid, slot), label_embed)
        query_box = query_box.index_put((known_bid, slot), box_embed)
    attn_mask = denoising_attn_mask(pad_size, num_queries, 2 * max_gt, device)
    return query_label, query_box, attn_mask, {"pad_size": pad_size, "num_dn_group": groups}
