"""Checkpoint files in the output directory that survive a killed or evicted Kubernetes pod.

Files (the official DINO names): ``checkpoint.pth`` the latest, replaced atomically (temp file, fsync,
rename) so a kill at any instant leaves the previous or the new file, never half of one;
``checkpoint{epoch:04d}.pth`` every K epochs; ``checkpoint_best_regular.pth`` the best by bbox AP.

The dict holds ``model``, ``optimizer``, ``lr_scheduler``, ``scaler``, ``epoch`` (last completed epoch, as in
DINO; -1 before the first), ``next`` (``{"epoch", "step"}`` where training continues, step = optimizer steps
done in that epoch), ``images_seen`` (global images consumed in ``next.epoch``), ``global_step``,
``best_ap``, ``rng`` (one RNG state per process), ``args``, ``model_config`` and ``categories``: the training
annotation file's categories as ``[{"id": int, "name": str}]`` (label = category id), the class names that
`dinops serve` reports. Numbered copies are links to the latest file, so every file carries all of it.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dinops.settings import SettingsError
from dinops.train import dist
from dinops.train.engine import StepState

log = logging.getLogger(__name__)

LATEST = "checkpoint.pth"
BEST = "checkpoint_best_regular.pth"


def numbered(epoch: int) -> str:
    return f"checkpoint{epoch:04d}.pth"


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself reaches the disk
    finally:
        os.close(dir_fd)
    return path


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint dict on CPU; tensors and plain values only (``weights_only``: unpickling runs no code)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {path} does not exist") from None
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:
        raise RuntimeError(
            f"checkpoint {path} cannot be read ({exc}); it may be truncated or not a checkpoint"
        ) from exc


def resume_path(resume: str, output_dir: str | os.PathLike) -> Path | None:
    """``auto``: the latest checkpoint of ``output_dir`` if there is one; a path: that file (which must exist)."""
    if not resume:
        return None
    if resume == "auto":
        latest = Path(output_dir) / LATEST
        return latest if latest.is_file() else None
    path = Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint file")
    return path


def rng_state() -> dict[str, Any]:
    """The RNG states as tensors and plain values, so that checkpoints load with ``weights_only=True``."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def keep_copy(latest: Path, target: Path) -> Path:
    """Keep the current latest checkpoint under another name: a hard link where the filesystem allows."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(latest, tmp)
    except OSError:
        shutil.copyfile(latest, tmp)
    os.replace(tmp, target)
    return target


def training_state(
    model, optimizer, scheduler, scaler, state: StepState, args, global_batch: int, categories: list[dict[str, Any]]
) -> dict[str, Any]:
    """The checkpoint dict (see the module docstring). Collective under DDP: every process must call it."""
    rng = dist.all_gather_object(rng_state())
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": state.epoch - 1,
        "next": {"epoch": state.epoch, "step": state.step},
        "images_seen": state.step * global_batch,
        "global_batch": global_batch,
        "global_step": state.global_step,
        "best_ap": state.best_ap,
        "rng": rng,
        "args": {k: v for k, v in vars(args).items() if k != "model_cfg"},
        "model_config": args.model_cfg,
        "categories": categories,
    }


def restore(path, model, optimizer, scheduler, scaler, model_cfg: dict, global_batch: int, rank: int) -> StepState:
    """Load a training checkpoint into the objects; refuse other model settings or a mid-epoch batch change."""
    ckpt = load(path)
    changed = sorted(k for k, v in ckpt.get("model_config", model_cfg).items() if model_cfg.get(k) != v)
    if changed:
        raise SettingsError(
            f"{path} was trained with other model settings ({', '.join(changed)}); resume with the same"
        )
    if ckpt.get("global_batch", global_batch) != global_batch and ckpt["next"]["step"]:
        raise SettingsError(
            f"{path} stopped mid-epoch with a global batch of {ckpt['global_batch']} images; "
            f"resume with the same batch x accumulation x processes (now {global_batch})"
        )
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["lr_scheduler"])
    scaler.load_state_dict(ckpt["scaler"])
    rng = ckpt["rng"]
    set_rng_state(rng[rank] if rank < len(rng) else rng[0])
    return StepState(ckpt["next"]["epoch"], ckpt["next"]["step"], ckpt["global_step"], ckpt["best_ap"])
