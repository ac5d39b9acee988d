"""Deformable transformer decoder with iterative box refinement (DINO's query_dim=4 variant)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dinops.model.box_ops import inverse_sigmoid
from dinops.model.deformable_attention import MSDeformAttn
from dinops.model.layers import MLP, activation_fn
from dinops.model.ms_deform_attn_core import SpatialShapes
from dinops.model.position_encoding import box_sine_embedding


class DeformableDecoderLayer(nn.Module):
    """Self-attention (``norm2``), deformable cross-attention (``norm1``), FFN (``norm3``); post-norm, in that order."""

    def __init__(
        self, *, d_model: int, d_ffn: int, dropout: float, activation: str, n_levels: int, n_heads: int, n_points: int
    ) -> None:
        super().__init__()
        self.cross_attn = MSDeformAttn(d_model=d_model, n_levels=n_levels, n_heads=n_heads, n_points=n_points)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = nn.MultiheadAttention(d_model, n_heads, dropout=dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, d_ffn)
        self.activation = activation_fn(activation)
        self.dropout3 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ffn, d_model)
        self.dropout4 = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(
        self,
        tgt: Tensor,
        query_pos: Tensor,
        reference_points: Tensor,
        memory: Tensor,
        spatial_shapes: SpatialShapes,
        memory_padding_mask: Tensor,
        self_attn_mask: Tensor | None,
    ) -> Tensor:
        """tgt, query_pos ``[B, Q, C]``; reference_points ``[B, Q, L, 4]``; memory ``[B, S, C]``;
        memory_padding_mask ``[B, S]`` True = padding; self_attn_mask ``[Q, Q]`` bool, True = may not attend."""
        q = (tgt + query_pos).transpose(0, 1)  # nn.MultiheadAttention is sequence-first here, as officially
        # need_weights=False: the averaged attention map is never used, and without it PyTorch takes its fused
        # scaled-dot-product kernel (on 900 queries the explicit path wrote and softmaxed [heads, 900, 900] maps).
        attended = self.self_attn(q, q, tgt.transpose(0, 1), attn_mask=self_attn_mask, need_weights=False)[0]
        attended = attended.transpose(0, 1)
        tgt = self.norm2(tgt + self.dropout2(attended))
        attended = self.cross_attn(tgt + query_pos, reference_points, memory, spatial_shapes, memory_padding_mask)
        tgt = self.norm1(tgt + self.dropout1(attended))
        ffn = self.linear2(self.dropout3(self.activation(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout4(ffn))


class DeformableDecoder(nn.Module):
    """Layers, final ``norm``, ``ref_point_head`` and (assigned by the detector) ``bbox_embed``/``class_embed``."""

    def __init__(
        self, *, num_layers: int, d_model: int, box_heads: nn.ModuleList, class_heads: nn.ModuleList, **layer_kwargs
    ):
        super().__init__()
        if len(box_heads) != num_layers or len(class_heads) != num_layers:
            raise ValueError(f"need one box and one class head per decoder layer ({num_layers})")
        self.layers = nn.ModuleList(DeformableDecoderLayer(d_model=d_model, **layer_kwargs) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.ref_point_head = MLP(input_dim=2 * d_model, hidden_dim=d_model, output_dim=d_model, num_layers=2)
        self.bbox_embed = box_heads
        self.class_embed = class_heads
        self.d_model = d_model

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        refpoints_unsigmoid: Tensor,
        spatial_shapes: SpatialShapes,
        valid_ratios: Tensor,
        memory_padding_mask: Tensor,
        self_attn_mask: Tensor | None = None,
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Refine boxes layer by layer.

        tgt ``[B, Q, C]`` content queries; refpoints_unsigmoid ``[B, Q, 4]`` logit-space cxcywh; valid_ratios
        ``[B, L, 2]`` (w, h). Returns (``hs``: per layer ``[B, Q, C]`` after ``norm``; ``references``: num_layers + 1
        tensors ``[B, Q, 4]`` in sigmoid space, the input box of every layer and the last layer's refined box).
        The next layer's reference is refined from the un-normalised output and detached; the returned ones are not.
        """
        reference = refpoints_unsigmoid.sigmoid()
        references = [reference]
        hs = []
        ratios = torch.cat([valid_ratios, valid_ratios], -1)[:, None]  # [B, 1, L, 4]
        output = tgt
        for layer_id, layer in enumerate(self.layers):
            reference_input = reference[:, :, None] * ratios  # [B, Q, L, 4]
            query_pos = self.ref_point_head(box_sine_embedding(reference_input[:, :, 0], self.d_model // 2))
            output = layer(
                output, query_pos, reference_input, memory, spatial_shapes, memory_padding_mask, self_attn_mask
            )
            refined = (self.bbox_embed[layer_id](output) + inverse_sigmoid(reference)).sigmoid()
            reference = refined.detach()
            references.append(refined)
            hs.append(self.norm(output))
        return hs, references
