"""Distributed data parallel through `torchrun`: NCCL on GPU, gloo on CPU; every helper works unlaunched too."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def init_distributed(device_type: str) -> tuple[int, int, int]:
    """Join the process group that torchrun describes in the environment; return (rank, world size, local rank)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, 0
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group(backend=backend)
    log.info("process %d of %d (local %d), backend %s", rank, world, local, backend)
    return rank, world, local


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_process(flag: bool, device: torch.device) -> bool:
    """True on every process when ``flag`` is true on any (e.g. one of them received SIGTERM)."""
    if not is_distributed():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def mean_over_processes(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Average scalars over processes (for logging)."""
    if not is_distributed() or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return {k: float(v) / world_size() for k, v in zip(keys, t.tolist(), strict=True)}


def shutdown() -> None:
    if is_distributed():
        dist.destroy_process_group()
