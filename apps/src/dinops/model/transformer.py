"""DINO's deformable transformer: flatten the levels, encode, pick two-stage proposals, decode."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dinops.model.decoder import DeformableDecoder
from dinops.model.deformable_attention import MSDeformAttn
from dinops.model.encoder import DeformableEncoder
from dinops.model.layers import MLP


@dataclass
class TransformerOutput:
    """What the detector needs, plus the intermediates that localise a mismatch.

    hs: per decoder layer ``[B, Q', C]`` (Q' = denoising pad + num_queries); references: num_layers + 1 boxes
    ``[B, Q', 4]`` in sigmoid space; interm_hidden ``[B, Q, C]`` and interm_boxes ``[B, Q, 4]`` (sigmoid, not
    detached) for the two-stage loss, None when two_stage_type is 'no'; init_box_proposal ``[B, Q, 4]``.
    """

    hs: list[Tensor]
    references: list[Tensor]
    interm_hidden: Tensor | None
    interm_boxes: Tensor | None
    init_box_proposal: Tensor
    memory: Tensor
    spatial_shapes: list[tuple[int, int]]
    valid_ratios: Tensor
    output_proposals: Tensor | None = None
    enc_outputs_class_unselected: Tensor | None = None
    topk_proposals: Tensor | None = None


def valid_ratios_of(mask: Tensor) -> Tensor:
    """``[B, H, W]`` padding mask -> ``[B, 2]`` (valid width / W, valid height / H) from the first column/row."""
    _, height, width = mask.shape
    valid_h = torch.sum(~mask[:, :, 0], 1)
    valid_w = torch.sum(~mask[:, 0, :], 1)
    return torch.stack([valid_w.float() / width, valid_h.float() / height], -1)


def encoder_output_proposals(
    memory: Tensor, padding_mask: Tensor, spatial_shapes: list[tuple[int, int]]
) -> tuple[Tensor, Tensor]:
    """One anchor box per token: centre of its pixel in the valid area, size ``0.05 * 2**level``.

    memory ``[B, S, C]``; padding_mask ``[B, S]`` True = padding. Returns (memory with padded/invalid tokens zeroed,
    proposals ``[B, S, 4]`` in logit space with ``+inf`` for padded tokens and boxes not inside (0.01, 0.99)).
    """
    batch = memory.shape[0]
    proposals = []
    start = 0
    for level, (height, width) in enumerate(spatial_shapes):
        mask_l = padding_mask[:, start : start + height * width].view(batch, height, width)
        valid_h = torch.sum(~mask_l[:, :, 0], 1)
        valid_w = torch.sum(~mask_l[:, 0, :], 1)
        grid_y, grid_x = torch.meshgrid(
            torch.linspace(0, height - 1, height, dtype=torch.float32, device=memory.device),
            torch.linspace(0, width - 1, width, dtype=torch.float32, device=memory.device),
            indexing="ij",
        )
        grid = torch.cat([grid_x.unsqueeze(-1), grid_y.unsqueeze(-1)], -1)
        scale = torch.cat([valid_w.unsqueeze(-1), valid_h.unsqueeze(-1)], 1).view(batch, 1, 1, 2)
        grid = (grid.unsqueeze(0).expand(batch, -1, -1, -1) + 0.5) / scale
        wh = torch.ones_like(grid) * 0.05 * (2.0**level)
        proposals.append(torch.cat((grid, wh), -1).view(batch, -1, 4))
        start += height * width
    proposals = torch.cat(proposals, 1)
    valid = ((proposals > 0.01) & (proposals < 0.99)).all(-1, keepdim=True)
    proposals = torch.log(proposals / (1 - proposals))
    proposals = proposals.masked_fill(padding_mask.unsqueeze(-1), float("inf"))
    proposals = proposals.masked_fill(~valid, float("inf"))
    memory = memory.masked_fill(padding_mask.unsqueeze(-1), 0.0).masked_fill(~valid, 0.0)
    return memory, proposals


class DeformableTransformer(nn.Module):
    """Encoder, two-stage query selection ('standard') or learned anchors ('no'), decoder.

    The detection heads are built by the detector and handed in, so that they are registered under
    ``transformer.decoder.{bbox,class}_embed`` and ``transformer.enc_out_*`` exactly as in official checkpoints.
    """

    def __init__(
        self,
        *,
        d_model: int,
        nhead: int,
        num_queries: int,
        num_encoder_layers: int,
        num_decoder_layers: int,
        dim_feedforward: int,
        dropout: float,
        activation: str,
        num_feature_levels: int,
        enc_n_points: int,
        dec_n_points: int,
        two_stage_type: str,
        embed_init_tgt: bool,
        box_heads: nn.ModuleList,
        class_heads: nn.ModuleList,
        enc_box_head: MLP | None,
        enc_class_head: nn.Linear | None,
    ) -> None:
        super().__init__()
        if two_stage_type not in ("standard", "no"):
            raise ValueError(f"two_stage_type must be 'standard' or 'no', got {two_stage_type!r}")
        self.d_model = d_model
        self.num_queries = num_queries
        self.num_feature_levels = num_feature_levels
        self.two_stage_type = two_stage_type
        self.embed_init_tgt = embed_init_tgt
        self.level_embed = nn.Parameter(torch.empty(num_feature_levels, d_model)) if num_feature_levels > 1 else None
        common = {
            "d_ffn": dim_feedforward,
            "dropout": dropout,
            "activation": activation,
            "n_levels": num_feature_levels,
        }
        self.encoder = DeformableEncoder(
            num_layers=num_encoder_layers, d_model=d_model, n_heads=nhead, n_points=enc_n_points, **common
        )
        self.decoder = DeformableDecoder(
            num_layers=num_decoder_layers,
            d_model=d_model,
            box_heads=box_heads,
            class_heads=class_heads,
            n_heads=nhead,
            n_points=dec_n_points,
            **common,
        )
        self.tgt_embed = nn.Embedding(num_queries, d_model) if embed_init_tgt or two_stage_type == "no" else None
        if two_stage_type == "standard":
            if enc_box_head is None or enc_class_head is None:
                raise ValueError("two_stage_type 'standard' needs enc_box_head and enc_class_head")
            self.enc_output = nn.Linear(d_model, d_model)
            self.enc_output_norm = nn.LayerNorm(d_model)
            self.enc_out_bbox_embed = enc_box_head
            self.enc_out_class_embed = enc_class_head
        else:
            self.refpoint_embed = nn.Embedding(num_queries, 4)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: xavier for every matrix, MSDeformAttn's own init, normal level/target embeddings."""
        heads = {id(p) for m in (self.decoder.bbox_embed, self.decoder.class_embed) for p in m.parameters()}
        for name in ("enc_out_bbox_embed", "enc_out_class_embed"):
            if hasattr(self, name):
                heads |= {id(p) for p in getattr(self, name).parameters()}
        for param in self.parameters():
            if param.dim() > 1 and id(param) not in heads:
                nn.init.xavier_uniform_(param)
        for module in self.modules():
            if isinstance(module, MSDeformAttn):
                module.reset_parameters()
        if self.level_embed is not None:
            nn.init.normal_(self.level_embed)
        if self.tgt_embed is not None:
            nn.init.normal_(self.tgt_embed.weight)

    def forward(
        self,
        srcs: list[Tensor],
        masks: list[Tensor],
        pos_embeds: list[Tensor],
        dn_query_label: Tensor | None = None,
        dn_query_box: Tensor | None = None,
        attn_mask: Tensor | None = None,
    ) -> TransformerOutput:
        """srcs/pos_embeds per level ``[B, C, H_l, W_l]``, masks ``[B, H_l, W_l]`` True = padding.

        dn_query_label ``[B, pad, C]`` and dn_query_box ``[B, pad, 4]`` (logit space) are prepended to the matching
        queries; attn_mask ``[pad+Q, pad+Q]`` (True = blocked) keeps the denoising groups apart.
        """
        spatial_shapes = [(int(s.shape[-2]), int(s.shape[-1])) for s in srcs]
        src_flat = torch.cat([s.flatten(2).transpose(1, 2) for s in srcs], 1)
        mask_flat = torch.cat([m.flatten(1) for m in masks], 1)
        pos_levels = [p.flatten(2).transpose(1, 2) for p in pos_embeds]
        if self.level_embed is not None:
            pos_levels = [p + self.level_embed[level].view(1, 1, -1) for level, p in enumerate(pos_levels)]
        pos_flat = torch.cat(pos_levels, 1)
        valid_ratios = torch.stack([valid_ratios_of(m) for m in masks], 1)
        memory = self.encoder(src_flat, pos_flat, spatial_shapes, valid_ratios, mask_flat)
        batch = memory.shape[0]
        extra: dict[str, Tensor] = {}
        if self.two_stage_type == "standard":
            if self.num_queries > memory.shape[1]:
                raise ValueError(
                    f"num_queries={self.num_queries} exceeds the {memory.shape[1]} encoder tokens of this input; "
                    "use larger images or fewer queries"
                )
            output_memory, proposals = encoder_output_proposals(memory, mask_flat, spatial_shapes)
            output_memory = self.enc_output_norm(self.enc_output(output_memory))
            class_unselected = self.enc_out_class_embed(output_memory)
            boxes_unselected = self.enc_out_bbox_embed(output_memory) + proposals  # logit space
            topk = torch.topk(class_unselected.max(-1)[0], self.num_queries, dim=1)[1]
            refpoints_undetached = torch.gather(boxes_unselected, 1, topk.unsqueeze(-1).repeat(1, 1, 4))
            refpoints = refpoints_undetached.detach()
            init_box_proposal = torch.gather(proposals, 1, topk.unsqueeze(-1).repeat(1, 1, 4)).sigmoid()
            interm_hidden = torch.gather(output_memory, 1, topk.unsqueeze(-1).repeat(1, 1, self.d_model))
            # Learned content queries (official default) or the selected encoder features.
            tgt = self.tgt_embed.weight[None].repeat(batch, 1, 1) if self.embed_init_tgt else interm_hidden.detach()
            interm_boxes = refpoints_undetached.sigmoid()
            extra = {
                "output_proposals": proposals,
                "enc_outputs_class_unselected": class_unselected,
                "topk_proposals": topk,
            }
        else:
            tgt = self.tgt_embed.weight[None].repeat(batch, 1, 1)
            refpoints = self.refpoint_embed.weight[None].repeat(batch, 1, 1)
            init_box_proposal = refpoints.sigmoid()
            interm_hidden = interm_boxes = None
        if dn_query_box is not None and dn_query_label is not None:
            refpoints = torch.cat([dn_query_box, refpoints], dim=1)
            tgt = torch.cat([dn_query_label, tgt], dim=1)
        hs, references = self.decoder(tgt, memory, refpoints, spatial_shapes, valid_ratios, mask_flat, attn_mask)
        return TransformerOutput(
            hs=hs,
            references=references,
            interm_hidden=interm_hidden,
            interm_boxes=interm_boxes,
            init_box_proposal=init_box_proposal,
            memory=memory,
            spatial_shapes=spatial_shapes,
            valid_ratios=valid_ratios,
            **extra,
        )
