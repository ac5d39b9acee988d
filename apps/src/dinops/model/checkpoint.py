"""Loading official and own checkpoints safely, and re-heading them for another class count.

Checkpoints are read with ``torch.load(weights_only=True)``: only tensors, plain containers and the globals listed in
:data:`SAFE_GLOBALS` (what official DINO ``.pth`` files contain besides tensors) can be unpickled, so a crafted file
cannot run code. A checkpoint is a dict with the state_dict under ``model`` (official and own ones), optionally
``args`` (official: ``argparse.Namespace``; own: a plain dict of :class:`DINOConfig` fields), or a bare state_dict.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dinops.model.config import DINOConfig
from dinops.model.inference import refuse_optimized

log = logging.getLogger(__name__)

SAFE_GLOBALS: list[Any] = [argparse.Namespace]
CLASS_COUNT_KEYS = ("class_embed", "label_enc")  # dropped when the class count changes


class UnsafeCheckpointError(ValueError):
    """The file needs arbitrary unpickling (code execution) to load; it was not loaded."""


@dataclass
class LoadReport:
    """What :func:`load_checkpoint` did: keys the model kept fresh, keys it ignored, heads dropped, stored args."""

    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    dropped_keys: list[str] = field(default_factory=list)
    checkpoint_num_classes: int | None = None
    args: dict[str, Any] | None = None


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Safely load a checkpoint file into ``{'model': state_dict, 'args': dict | None, ...}``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains objects outside the safe allow-list (tensors, containers, "
            f"argparse.Namespace), so unpickling it could run code. Detail: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a checkpoint: expected a dict, got {type(raw).__name__}")
    if "model" in raw and isinstance(raw["model"], dict):
        checkpoint = dict(raw)
    elif raw and all(isinstance(v, Tensor) for v in raw.values()):
        checkpoint = {"model": raw}
    else:
        raise ValueError(f"{path} has no 'model' state_dict (keys: {sorted(raw)[:10]})")
    args = checkpoint.get("args")
    checkpoint["args"] = vars(args) if isinstance(args, argparse.Namespace) else args
    state = checkpoint["model"]
    if state and all(k.startswith("module.") for k in state):  # saved from DistributedDataParallel
        checkpoint["model"] = {k[len("module.") :]: v for k, v in state.items()}
    return checkpoint


def checkpoint_config(checkpoint: dict[str, Any]) -> DINOConfig | None:
    """The model configuration a checkpoint (from :func:`read_checkpoint`) carries, or None.

    dinops training stores the full :class:`DINOConfig` as ``model_config`` (its ``args`` are the training
    command's); official checkpoints store the official ``args``. The ImageNet weights path of the training run
    is dropped: the checkpoint holds the backbone weights already.
    """
    if isinstance(checkpoint.get("model_config"), dict):
        return DINOConfig(**checkpoint["model_config"]).replace(backbone_weights=None)
    if isinstance(checkpoint.get("args"), dict):
        return DINOConfig.from_official(checkpoint["args"])
    return None


def config_from_checkpoint(path: str | Path) -> DINOConfig:
    """The :class:`DINOConfig` stored in a checkpoint (dinops' ``model_config`` or the official ``args``)."""
    cfg = checkpoint_config(read_checkpoint(path))
    if cfg is None:
        raise ValueError(f"{path} stores no model configuration; build the model from a DINOConfig and load_checkpoint")
    return cfg


def _class_count(state: dict[str, Tensor]) -> int | None:
    for key in ("class_embed.0.bias", "transformer.decoder.class_embed.0.bias", "transformer.enc_out_class_embed.bias"):
        if key in state:
            return int(state[key].shape[0])
    return None


def load_checkpoint(
    model: nn.Module, path: str | Path, num_classes: int | None = None, checkpoint: dict[str, Any] | None = None
) -> LoadReport:
    """Load weights from ``path`` into ``model`` and report what did not fit.

    checkpoint: ``path`` already read by :func:`read_checkpoint`; the weights then come from it, not from a second
    read of a file that a training run may have replaced meanwhile.

    num_classes: the class count the model is meant to have (default: the model's ``num_classes``). When the
    checkpoint's class count differs, the class heads and ``label_enc`` are dropped (logged) and keep the model's
    fresh initialisation: the fine-tuning case. Any other shape mismatch is an error naming the keys.
    """
    refuse_optimized(model, f"load {path} into it")
    checkpoint = read_checkpoint(path) if checkpoint is None else checkpoint
    state = dict(checkpoint["model"])
    wanted = num_classes if num_classes is not None else getattr(model, "num_classes", None)
    stored = _class_count(state)
    own = model.state_dict()
    report = LoadReport(checkpoint_num_classes=stored, args=checkpoint.get("args"))
    if wanted is not None and stored is not None and stored != wanted:
        report.dropped_keys = sorted(k for k in state if any(word in k for word in CLASS_COUNT_KEYS))
        for key in report.dropped_keys:
            del state[key]
        log.warning(
            "checkpoint %s has %d classes, the model %d: dropped %d class-head and label_enc entries, "
            "which keep their fresh initialisation",
            path,
            stored,
            wanted,
            len(report.dropped_keys),
        )
    mismatched = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and v.shape != own[k].shape
    ]
    if mismatched:
        raise ValueError(f"{path} does not fit this model ({len(mismatched)} shape mismatches): {mismatched[:5]}")
    result = model.load_state_dict(state, strict=False)
    report.missing_keys = list(result.missing_keys)
    report.unexpected_keys = list(result.unexpected_keys)
    if report.missing_keys:
        log.warning(
            "checkpoint %s lacks %d model keys, e.g. %s", path, len(report.missing_keys), report.missing_keys[:5]
        )
    if report.unexpected_keys:
        log.warning(
            "checkpoint %s has %d keys the model does not use, e.g. %s",
            path,
            len(report.unexpected_keys),
            report.unexpected_keys[:5],
        )
    log.info("loaded checkpoint %s (%d entries)", path, len(state))
    return report


def save_checkpoint(path: str | Path, model: nn.Module, config: DINOConfig | None = None, **extra: Any) -> None:
    """Write ``{'model': state_dict, 'args': config dict, **extra}`` atomically (temp file, then rename)."""
    refuse_optimized(model, f"save {path} as a checkpoint")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"model": model.state_dict(), **extra}
    if config is not None:
        payload["args"] = config.to_dict()
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
