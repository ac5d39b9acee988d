"""The fast inference path: the same detector rearranged for evaluation on a CPU (and faster on a GPU too).

:func:`optimize_for_inference` changes a loaded model in place, keeping its results (tested equal to the reference
path within float32 rounding, and against the official reference outputs at the fidelity tolerances):

* **Frozen batch norm folded into the convolutions** of the ResNet backbone: ``bn(conv(x))`` is
  ``conv'(x) + b'`` with ``W' = W * scale`` and ``b' = bias - running_mean * scale`` (``scale = weight *
  rsqrt(running_var + eps)``, torchvision's ``FrozenBatchNorm2d``), computed in float64 and rounded once. It saves
  two passes over every feature map.
* **Channels-last** backbone and input projections: oneDNN's convolutions work in NHWC, so the NCHW reference
  path pays a layout conversion around each of them; the flattened ``[B, H*W, C]`` tokens of a channels-last map are
  then a view.
* **The encoder in token chunks** (:class:`dinops.model.encoder.DeformableEncoderLayer`): the values are projected
  and laid out once per layer, then attention, norms and feed-forward run over ``chunk_tokens`` tokens at a time.

Measured on the build machine (2 cores, AVX2; DINO-4scale R50, 800x1066, batch 1): backbone 2.0 s -> 1.1 s, one
encoder layer 0.46 s -> 0.30 s (docs/model.md, "Speed and memory", has the whole-model figures and the command).

The folded model has other parameters than the official layout (no ``bn*`` entries, conv biases), so it is for
inference only: :func:`dinops.model.load_checkpoint` and :func:`dinops.model.save_checkpoint` refuse it, and
training code never sees it (only ``dinops serve`` and ``dinops eval`` call this).
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from dinops.model.encoder import DeformableEncoderLayer

log = logging.getLogger(__name__)

# Measured on the build machine, whole model, best of 3: chunks of 256 tokens 4.26 s, 512 3.98, 1024 3.70, 2048 3.49,
# 4096 3.69, 8192 3.79 (smaller chunks pay each op's fixed cost more often, larger ones leave the caches).
DEFAULT_CHUNK_TOKENS = 2048
_MARK = "dinops_inference_optimized"


class InferenceOnlyError(RuntimeError):
    """A model rearranged by :func:`optimize_for_inference` was given to code that needs the official layout."""


def is_optimized(model: nn.Module) -> bool:
    """Whether :func:`optimize_for_inference` has changed ``model``."""
    return bool(getattr(model, _MARK, False))


def refuse_optimized(model: nn.Module, action: str) -> None:
    """Raise :class:`InferenceOnlyError` when ``model`` is the folded inference form."""
    if is_optimized(model):
        raise InferenceOnlyError(
            f"cannot {action}: this model was rearranged for inference by optimize_for_inference (batch norm folded "
            "into the convolutions); load the weights into a fresh build_dino(cfg) model, then optimize that"
        )


def _folded(conv: nn.Conv2d, bn: FrozenBatchNorm2d) -> nn.Conv2d:
    scale = bn.weight.double() * torch.rsqrt(bn.running_var.double() + bn.eps)
    bias = bn.bias.double() - bn.running_mean.double() * scale
    if conv.bias is not None:
        bias = bias + conv.bias.double() * scale
    folded = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
        bias=True,
        padding_mode=conv.padding_mode,
        device=conv.weight.device,
        dtype=conv.weight.dtype,
    )
    with torch.no_grad():
        folded.weight.copy_((conv.weight.double() * scale.view(-1, 1, 1, 1)).to(conv.weight.dtype))
        folded.bias.copy_(bias.to(conv.weight.dtype))
    return folded.requires_grad_(False)


def fold_frozen_batch_norm(module: nn.Module) -> int:
    """Fold every ``FrozenBatchNorm2d`` that follows a convolution in torchvision's ResNet naming (``conv{i}`` +
    ``bn{i}``, ``downsample`` = ``[conv, bn]``) into that convolution, in place; returns how many were folded."""
    count = 0
    for parent in list(module.modules()):
        for index in (1, 2, 3):
            conv, bn = getattr(parent, f"conv{index}", None), getattr(parent, f"bn{index}", None)
            if isinstance(conv, nn.Conv2d) and isinstance(bn, FrozenBatchNorm2d):
                setattr(parent, f"conv{index}", _folded(conv, bn))
                setattr(parent, f"bn{index}", nn.Identity())
                count += 1
        downsample = getattr(parent, "downsample", None)
        if (
            isinstance(downsample, nn.Sequential)
            and len(downsample) == 2
            and isinstance(downsample[0], nn.Conv2d)
            and isinstance(downsample[1], FrozenBatchNorm2d)
        ):
            parent.downsample = nn.Sequential(_folded(downsample[0], downsample[1]), nn.Identity())
            count += 1
    return count


def optimize_for_inference(model: nn.Module, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> nn.Module:
    """Rearrange a DINO model (``build_dino``, weights loaded) for inference, in place; returns it in eval mode.

    Idempotent. ``chunk_tokens`` is the encoder's chunk (0 keeps the reference encoder).
    """
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0, got {chunk_tokens}")
    model.eval().requires_grad_(False)
    if not is_optimized(model):
        folded = fold_frozen_batch_norm(model)
        for name in ("backbone", "input_proj"):
            part = getattr(model, name, None)
            if part is not None:
                part.to(memory_format=torch.channels_last)
        setattr(model, _MARK, True)
        log.info(
            "inference path: %d batch norms folded, channels-last backbone, encoder chunks of %d", folded, chunk_tokens
        )
    for layer in model.modules():
        if isinstance(layer, DeformableEncoderLayer):
            layer.chunk_tokens = chunk_tokens
    return model


def cpu_bfloat16_supported() -> bool:
    """Whether this CPU computes bfloat16 matrix products in hardware: AVX-512 BF16 or AMX (PyTorch's own cpuinfo
    tests, ``torch.cpu._is_avx512_bf16_supported`` and ``_is_amx_tile_supported``), with oneDNN built in. oneDNN's
    ``_is_mkldnn_bf16_supported`` alone is not that answer: it also says yes on AVX-512 without BF16 (any AVX-512
    BW/VL/DQ core, e.g. Cascade Lake), where bfloat16 is converted in software: there a bfloat16 matrix product ran
    at 16 GFLOP/s against 39 in float32 (a 2-core Cascade Lake build machine), and on the AVX2 build machine, where
    oneDNN says no, at 1.1 against 177. Such CPUs run float32."""
    try:
        hardware = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return bool(hardware and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
