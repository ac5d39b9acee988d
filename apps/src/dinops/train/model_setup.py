"""From resolved settings to a DINOConfig, a model on its device, and AdamW with DINO's parameter groups."""

from __future__ import annotations

import dataclasses
import logging
from argparse import Namespace
from typing import Any

import torch

from dinops.model import DINOConfig
from dinops.settings import SettingsError, parse_bool

log = logging.getLogger(__name__)

# A configuration that trains on a laptop CPU in minutes on the synthetic shapes (see docs/training.md).
TINY: dict[str, Any] = {
    "backbone": "resnet18",
    "hidden_dim": 64,
    "nheads": 4,
    "num_queries": 30,
    "enc_layers": 1,
    "dec_layers": 2,
    "dim_feedforward": 256,
    "enc_n_points": 4,
    "dec_n_points": 4,
    "dn_number": 20,
    "num_select": 30,
}


def parse_overrides(text: str) -> dict[str, Any]:
    """``"hidden_dim=128,use_dn=false"`` -> typed values; unknown DINOConfig names are an error."""
    fields = {f.name: f for f in dataclasses.fields(DINOConfig)}
    defaults = DINOConfig()
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise SettingsError(
                f"--model-overrides: {item!r} is not NAME=VALUE with a DINOConfig name (e.g. hidden_dim=128)"
            )
        current = getattr(defaults, name)
        try:
            if isinstance(current, bool):
                value: Any = parse_bool(raw)
            elif isinstance(current, int):
                value = int(raw)
            elif isinstance(current, float):
                value = float(raw)
            elif isinstance(current, list):
                value = [int(v) for v in raw.split(":")] if raw else []
            elif current is None and raw.lower() in {"", "none"}:
                value = None
            else:
                value = raw
        except ValueError as exc:
            raise SettingsError(f"--model-overrides: {name}={raw!r}: {exc}") from None
        out[name] = value
    return out


def model_config(args: Namespace, num_classes: int, dn_labelbook_size: int) -> DINOConfig:
    base = DINOConfig.dino_4scale_r50() if args.model == "dino-4scale-r50" else DINOConfig().replace(**TINY)
    cfg = base.replace(
        num_classes=num_classes,
        dn_labelbook_size=max(dn_labelbook_size, num_classes),
        lr_backbone=args.lr_backbone,
        backbone_weights=args.backbone_weights or None,
    )
    cfg = cfg.replace(**parse_overrides(args.model_overrides))
    try:
        cfg.validate()
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return cfg


def memory_format(args: Namespace, device: torch.device) -> torch.memory_format:
    """The layout of the model's convolution weights and of the input images: channels-last on a GPU with
    ``--channels-last`` (cuDNN's NHWC kernels; docs/training.md has the measured effect), contiguous elsewhere.
    The same arithmetic in another memory order: results differ by float rounding only."""
    return torch.channels_last if args.channels_last and device.type == "cuda" else torch.contiguous_format


def param_groups(model: torch.nn.Module, lr: float, lr_backbone: float) -> list[dict[str, Any]]:
    """DINO's 'default' groups: backbone at ``lr_backbone``, everything else at ``lr``; frozen ones left out."""
    backbone, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (backbone if "backbone." in name else rest).append(p)
    groups = [{"params": rest, "lr": lr}]
    if backbone:
        groups.append({"params": backbone, "lr": lr_backbone})
    return groups


def lr_factor(step: int, warmup_steps: int, drop_steps: list[int]) -> float:
    """Linear warm-up from 1/1000, then x0.1 at every drop step passed."""
    factor = 0.1 ** sum(step >= d for d in drop_steps)
    if warmup_steps > 0 and step < warmup_steps:
        factor *= 0.001 + 0.999 * step / warmup_steps
    return factor
