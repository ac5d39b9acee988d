"""The DINO detector in pure PyTorch, checkpoint-compatible with the official implementation.

Public API::

    from dinops.model import DINOConfig, build_dino, build_criterion, postprocess, pad_images, load_checkpoint

See docs/model.md for the manual and each module for its tensor contracts.
"""

from dinops.model.batching import pad_images
from dinops.model.build import build_backbone, build_criterion, build_dino
from dinops.model.checkpoint import load_checkpoint, save_checkpoint
from dinops.model.config import DINOConfig
from dinops.model.criterion import weighted_total
from dinops.model.ms_deform_attn_core import deformable_attention_backend, set_deformable_attention_backend
from dinops.model.postprocess import postprocess

__all__ = [
    "DINOConfig",
    "build_backbone",
    "build_criterion",
    "build_dino",
    "deformable_attention_backend",
    "load_checkpoint",
    "pad_images",
    "postprocess",
    "save_checkpoint",
    "set_deformable_attention_backend",
    "weighted_total",
]
