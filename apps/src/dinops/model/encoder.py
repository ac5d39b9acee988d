"""Deformable transformer encoder (post-norm): self-attention of every multi-scale token through MSDeformAttn."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dinops.model.deformable_attention import MSDeformAttn
from dinops.model.layers import activation_fn
from dinops.model.ms_deform_attn_core import SpatialShapes


class DeformableEncoderLayer(nn.Module):
    """``x = norm1(x + attn(x + pos, ref, x)); x = norm2(x + linear2(act(linear1(x))))``.

    Everything after the value projection is per token, so in inference (eval mode, no autograd) with
    ``chunk_tokens`` set the layer runs over chunks of that many tokens (per image): the sampling intermediates and
    the ``[chunk, d_ffn]`` activation stay in the CPU's caches instead of a ``[S, d_ffn]`` tensor (146 MB for
    DINO-4scale at 800x1066) going through memory twice. Same operations per token, so the same result; 0 (the
    default) is the reference path. :func:`dinops.model.inference.optimize_for_inference` sets it.
    """

    chunk_tokens: int = 0

    @property
    def fast(self) -> bool:
        """Whether this call takes the chunked path (``chunk_tokens`` set, eval mode, no autograd)."""
        return self.chunk_tokens > 0 and not self.training and not torch.is_grad_enabled()

    def __init__(
        self, *, d_model: int, d_ffn: int, dropout: float, activation: str, n_levels: int, n_heads: int, n_points: int
    ) -> None:
        super().__init__()
        self.self_attn = MSDeformAttn(d_model=d_model, n_levels=n_levels, n_heads=n_heads, n_points=n_points)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, d_ffn)
        self.activation = activation_fn(activation)
        self.dropout2 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ffn, d_model)
        self.dropout3 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(
        self,
        src: Tensor,
        pos: Tensor,
        reference_points: Tensor,
        spatial_shapes: SpatialShapes,
        padding_mask: Tensor,
        reference_pixels: Tensor | None = None,
    ) -> Tensor:
        """src, pos ``[B, S, C]``; reference_points ``[B, S, L, 2]``; padding_mask ``[B, S]`` True = padding;
        reference_pixels: :func:`pixel_references` of them when the caller has it (fast path only)."""
        if self.fast:
            if reference_pixels is None:
                reference_pixels = pixel_references(reference_points, spatial_shapes, self.self_attn.n_points)
            return self._forward_chunked(src, pos, reference_pixels, spatial_shapes, padding_mask)
        attended = self.self_attn(src + pos, reference_points, src, spatial_shapes, padding_mask)
        src = self.norm1(src + self.dropout1(attended))
        ffn = self.linear2(self.dropout2(self.activation(self.linear1(src))))
        return self.norm2(src + self.dropout3(ffn))

    def _forward_chunked(
        self, src: Tensor, pos: Tensor, reference_pixels: Tensor, spatial_shapes: SpatialShapes, padding_mask: Tensor
    ) -> Tensor:
        prepared = self.self_attn.prepare(src, spatial_shapes, padding_mask)
        output = torch.empty_like(src)
        step = max(1, self.chunk_tokens // src.shape[0])
        for start in range(0, src.shape[1], step):
            rows = slice(start, start + step)
            chunk = src[:, rows]
            attended = self.self_attn.attend_pixels(chunk + pos[:, rows], reference_pixels[:, rows], prepared)
            chunk = self.norm1(chunk + attended)
            output[:, rows] = self.norm2(chunk + self._feed_forward(chunk))
        return output

    def _feed_forward(self, chunk: Tensor) -> Tensor:
        """``linear2(act(linear1(x)))`` with the first bias added in place: ``addmm`` would first copy the bias into
        every row of the ``[tokens, d_ffn]`` output (a strided copy as slow as the matrix product's own writes)."""
        hidden = torch.matmul(chunk, self.linear1.weight.t()).add_(self.linear1.bias)
        return self.linear2(self.activation(hidden))


def pixel_references(reference_points: Tensor, spatial_shapes: SpatialShapes, points: int) -> Tensor:
    """Encoder reference points ``[B, S, L, 2]`` (normalised x, y) -> pixel coordinates ``ref * (W_l, H_l) - 0.5``
    ``[B, S, 1, L, P, 2]``, expanded over the points and contiguous, so that adding ``[B, S, M, L, P, 2]`` offsets
    broadcasts over the heads only. The same for every layer: the fast path computes it once per forward."""
    sizes = torch.tensor(
        [[w, h] for h, w in spatial_shapes], dtype=reference_points.dtype, device=reference_points.device
    )
    pixels = reference_points * sizes - 0.5
    batch, tokens, levels, _ = pixels.shape
    return pixels[:, :, None, :, None, :].expand(batch, tokens, 1, levels, points, 2).contiguous()


def encoder_reference_points(spatial_shapes: SpatialShapes, valid_ratios: Tensor) -> Tensor:
    """Pixel centres of every level, in the valid area's normalised coordinates, seen from every level.

    valid_ratios: ``[B, L, 2]`` as (w, h). Returns ``[B, S, L, 2]`` (x, y).
    """
    refs = []
    for level, (height, width) in enumerate(spatial_shapes):
        ref_y, ref_x = torch.meshgrid(
            torch.linspace(0.5, height - 0.5, height, dtype=torch.float32, device=valid_ratios.device),
            torch.linspace(0.5, width - 0.5, width, dtype=torch.float32, device=valid_ratios.device),
            indexing="ij",
        )
        ref_y = ref_y.reshape(-1)[None] / (valid_ratios[:, None, level, 1] * height)
        ref_x = ref_x.reshape(-1)[None] / (valid_ratios[:, None, level, 0] * width)
        refs.append(torch.stack((ref_x, ref_y), -1))
    return torch.cat(refs, 1)[:, :, None] * valid_ratios[:, None]


class DeformableEncoder(nn.Module):
    """A stack of :class:`DeformableEncoderLayer` with no final norm (keys ``layers.{i}``)."""

    def __init__(self, *, num_layers: int, **layer_kwargs: int | float | str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DeformableEncoderLayer(**layer_kwargs) for _ in range(num_layers))

    def forward(
        self, src: Tensor, pos: Tensor, spatial_shapes: SpatialShapes, valid_ratios: Tensor, padding_mask: Tensor
    ) -> Tensor:
        """src, pos ``[B, S, C]``; valid_ratios ``[B, L, 2]``; padding_mask ``[B, S]`` -> memory ``[B, S, C]``."""
        reference_points = encoder_reference_points(spatial_shapes, valid_ratios)
        pixels: Tensor | None = None
        for layer in self.layers:
            if layer.fast and pixels is None:
                pixels = pixel_references(reference_points, spatial_shapes, layer.self_attn.n_points)
            src = layer(src, pos, reference_points, spatial_shapes, padding_mask, pixels if layer.fast else None)
        return src
