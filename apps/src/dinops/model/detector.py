"""`DINO`: backbone, input projections, deformable transformer, prediction heads and denoising queries."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor, nn

from dinops.model.backbone import BackboneWithPosition, resize_mask
from dinops.model.box_ops import inverse_sigmoid
from dinops.model.denoising import prepare_for_cdn
from dinops.model.layers import MLP
from dinops.model.transformer import DeformableTransformer


def _heads(hidden_dim: int, num_classes: int, count: int, share_box: bool, share_class: bool) -> tuple[Any, ...]:
    """Initial class/box heads and the per-layer lists (one module repeated when shared, copies otherwise)."""
    class_head = nn.Linear(hidden_dim, num_classes)
    box_head = MLP(input_dim=hidden_dim, hidden_dim=hidden_dim, output_dim=4, num_layers=3)
    nn.init.constant_(class_head.bias, -math.log((1 - 0.01) / 0.01))  # prior probability 0.01
    nn.init.constant_(box_head.layers[-1].weight, 0.0)
    nn.init.constant_(box_head.layers[-1].bias, 0.0)
    box_heads = nn.ModuleList(box_head if share_box else copy.deepcopy(box_head) for _ in range(count))
    class_heads = nn.ModuleList(class_head if share_class else copy.deepcopy(class_head) for _ in range(count))
    return class_head, box_head, class_heads, box_heads


class DINO(nn.Module):
    """The detector. See :meth:`forward` for the input and output contract."""

    def __init__(
        self,
        *,
        backbone: BackboneWithPosition,
        num_classes: int,
        num_queries: int,
        hidden_dim: int = 256,
        nheads: int = 8,
        num_feature_levels: int = 4,
        enc_layers: int = 6,
        dec_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.0,
        activation: str = "relu",
        enc_n_points: int = 4,
        dec_n_points: int = 4,
        two_stage_type: str = "standard",
        embed_init_tgt: bool = True,
        dec_pred_bbox_embed_share: bool = True,
        dec_pred_class_embed_share: bool = True,
        two_stage_bbox_embed_share: bool = False,
        two_stage_class_embed_share: bool = False,
        aux_loss: bool = True,
        dn_number: int = 100,
        dn_label_noise_ratio: float = 0.5,
        dn_box_noise_scale: float = 0.4,
        dn_labelbook_size: int = 91,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.hidden_dim = hidden_dim
        self.num_feature_levels = num_feature_levels
        self.aux_loss = aux_loss
        self.dn_number = dn_number
        self.dn_label_noise_ratio = dn_label_noise_ratio
        self.dn_box_noise_scale = dn_box_noise_scale
        class_head, box_head, class_heads, box_heads = _heads(
            hidden_dim, num_classes, dec_layers, dec_pred_bbox_embed_share, dec_pred_class_embed_share
        )
        enc_box_head = enc_class_head = None
        if two_stage_type != "no":
            enc_box_head = box_head if two_stage_bbox_embed_share else copy.deepcopy(box_head)
            enc_class_head = class_head if two_stage_class_embed_share else copy.deepcopy(class_head)
        self.transformer = DeformableTransformer(
            d_model=hidden_dim,
            nhead=nheads,
            num_queries=num_queries,
            num_encoder_layers=enc_layers,
            num_decoder_layers=dec_layers,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            activation=activation,
            num_feature_levels=num_feature_levels,
            enc_n_points=enc_n_points,
            dec_n_points=dec_n_points,
            two_stage_type=two_stage_type,
            embed_init_tgt=embed_init_tgt,
            box_heads=box_heads,
            class_heads=class_heads,
            enc_box_head=enc_box_head,
            enc_class_head=enc_class_head,
        )
        self.label_enc = nn.Embedding(dn_labelbook_size + 1, hidden_dim)
        self.input_proj = self._input_projections(backbone.num_channels, hidden_dim, num_feature_levels)
        self.backbone = backbone
        self.bbox_embed = box_heads
        self.class_embed = class_heads

    @staticmethod
    def _input_projections(channels: list[int], hidden_dim: int, levels: int) -> nn.ModuleList:
        """1x1 conv + GroupNorm per backbone level, then 3x3 stride-2 convs for the extra levels."""
        projections = [
            nn.Sequential(nn.Conv2d(c, hidden_dim, kernel_size=1), nn.GroupNorm(32, hidden_dim)) for c in channels
        ]
        in_channels = channels[-1]
        for _ in range(levels - len(channels)):
            conv = nn.Conv2d(in_channels, hidden_dim, kernel_size=3, stride=2, padding=1)
            projections.append(nn.Sequential(conv, nn.GroupNorm(32, hidden_dim)))
            in_channels = hidden_dim
        for projection in projections:
            nn.init.xavier_uniform_(projection[0].weight, gain=1)
            nn.init.constant_(projection[0].bias, 0)
        return nn.ModuleList(projections)

    def _multi_scale(self, images: Tensor, mask: Tensor) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """Projected maps, masks and positions of every level (backbone levels, then extra strided levels)."""
        features, masks, positions = self.backbone(images, mask)
        srcs = [projection(f) for projection, f in zip(self.input_proj, features, strict=False)]
        for level in range(len(srcs), self.num_feature_levels):
            src = self.input_proj[level](features[-1] if level == len(features) else srcs[-1])
            level_mask = resize_mask(mask, tuple(src.shape[-2:]))
            srcs.append(src)
            masks.append(level_mask)
            positions.append(self.backbone[1](level_mask).to(src.dtype))
        return srcs, masks, positions

    def forward(
        self,
        images: Tensor,
        mask: Tensor | None = None,
        targets: list[dict[str, Tensor]] | None = None,
        return_intermediates: bool = False,
    ) -> dict[str, Any]:
        """Detect.

        images ``[B, 3, H, W]`` normalised; mask ``[B, H, W]`` bool, True = padding (None: no padding).
        targets (training only, for the denoising queries): per image ``labels`` ``[n]`` and ``boxes`` ``[n, 4]``
        normalised cxcywh.
        Returns ``pred_logits`` ``[B, Q, C]`` (pre-sigmoid, no background class), ``pred_boxes`` ``[B, Q, 4]``
        (sigmoid cxcywh relative to the unpadded image), ``aux_outputs`` (earlier decoder layers),
        ``interm_outputs`` and ``interm_outputs_for_matching_pre`` (two-stage only) and ``dn_meta`` (None, or
        ``pad_size``, ``num_dn_group`` and the denoising predictions ``output_known_lbs_bboxes``).
        """
        if mask is None:
            mask = torch.zeros(images.shape[0], *images.shape[-2:], dtype=torch.bool, device=images.device)
        if mask.shape != (images.shape[0], *images.shape[-2:]) or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be bool [B, H, W] matching images {tuple(images.shape)}, "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        srcs, masks, positions = self._multi_scale(images, mask)
        dn_label = dn_box = attn_mask = dn_meta = None
        if self.dn_number > 0 and targets is not None and self.training:
            dn_label, dn_box, attn_mask, dn_meta = prepare_for_cdn(
                targets=targets,
                dn_number=self.dn_number,
                label_noise_ratio=self.dn_label_noise_ratio,
                box_noise_scale=self.dn_box_noise_scale,
                num_queries=self.num_queries,
                num_classes=self.num_classes,
                hidden_dim=self.hidden_dim,
                label_enc=self.label_enc,
            )
        result = self.transformer(srcs, masks, positions, dn_label, dn_box, attn_mask)
        hs = list(result.hs)
        hs[0] = hs[0] + self.label_enc.weight[0, 0] * 0.0  # keeps label_enc in the graph (DDP), no numeric effect
        logits = torch.stack([head(h) for head, h in zip(self.class_embed, hs, strict=True)])
        boxes = torch.stack(
            [
                (head(h) + inverse_sigmoid(ref)).sigmoid()
                for head, h, ref in zip(self.bbox_embed, hs, result.references[:-1], strict=True)
            ]
        )
        if dn_meta is not None and dn_meta["pad_size"] > 0:
            pad = dn_meta["pad_size"]
            dn_meta["output_known_lbs_bboxes"] = self._pack(logits[:, :, :pad], boxes[:, :, :pad])
            logits, boxes = logits[:, :, pad:], boxes[:, :, pad:]
        out = self._pack(logits, boxes)
        if result.interm_hidden is not None:
            interm_logits = self.transformer.enc_out_class_embed(result.interm_hidden)
            out["interm_outputs"] = {"pred_logits": interm_logits, "pred_boxes": result.interm_boxes}
            out["interm_outputs_for_matching_pre"] = {
                "pred_logits": interm_logits,
                "pred_boxes": result.init_box_proposal,
            }
        out["dn_meta"] = dn_meta
        if return_intermediates:
            out["intermediates"] = {"srcs": srcs, "masks": masks, "pos_embeds": positions, "transformer": result}
        return out

    def _pack(self, logits: Tensor, boxes: Tensor) -> dict[str, Any]:
        """``[layers, B, Q, ·]`` stacks -> final-layer dict, with the earlier layers as ``aux_outputs``."""
        out: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [
                {"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1], strict=True)
            ]
        return out
