"""Distributed data parallel through `torchrun`: NCCL on GPU, gloo on CPU; every helper works unlaunched too.

Under the Kubeflow operators the pod runs ``torchrun -m dinops.train.main``. torchrun reads only ``PET_*``
variables (``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``;
torch 2.14.1 ``torch/distributed/argparse_util.py:45-46``) and starts each worker with its own ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and ``TORCHELASTIC_RUN_ID``
(``torch/distributed/elastic/agent/server/local_elastic_agent.py:424-443``) laid over a copy of its own
environment (``torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py:48-50``). So the
``RANK``/``WORLD_SIZE``/``MASTER_*`` a PyTorchJob also injects (Training Operator v1.9.4
``pkg/controller.v1/pytorch/envvar.go``: RANK = replica index, WORLD_SIZE = replicas x nprocPerNode) never reach
a worker: the worker reads torchrun's values, which count every process.

Started without torchrun, a TrainJob pod (Trainer v2.3.0 injects only ``PET_*``:
``pkg/runtime/framework/plugins/torch/torch.go``) would train alone, one independent copy per node, and a
PyTorchJob pod with ``nprocPerNode`` > 1 would wait for processes nobody starts: :func:`launch_problem` refuses
both (exit 2, the fix in the message).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from dinops.settings import SettingsError

log = logging.getLogger(__name__)


def _count(value: str) -> int | None:
    """A process or node count from a ``PET_*`` value: ``"2"``, elastic ``"1:4"`` (the maximum); None for ``auto``."""
    last = value.rpartition(":")[2].strip()
    return int(last) if last.isdigit() else None


def launch_problem(environ: Mapping[str, str]) -> str | None:
    """Why this process, started as it was, cannot be the training the operator's environment describes; or None."""
    if "TORCHELASTIC_RUN_ID" in environ:  # a torchrun worker: torchrun set RANK, WORLD_SIZE, LOCAL_RANK itself
        return None
    nnodes, nproc = environ.get("PET_NNODES", "1"), environ.get("PET_NPROC_PER_NODE", "1")
    fix = "start it as `torchrun -m dinops.train.main` (docs/training.md, 'Launch under the Kubeflow operators')"
    if (_count(nproc) or 1) > 1:
        return (
            f"PET_NPROC_PER_NODE={nproc}: the operator expects {nproc} processes in this pod, "
            f"but this one was not started by torchrun; {fix}"
        )
    if (_count(nnodes) or 1) > 1 and not ("RANK" in environ and "WORLD_SIZE" in environ):
        return (
            f"PET_NNODES={nnodes} (a Kubeflow TrainJob) without RANK/WORLD_SIZE: this process was not started by "
            f"torchrun and would train alone, one independent copy per node; {fix}"
        )
    return None


def init_distributed(device_type: str) -> tuple[int, int, int]:
    """Join the process group that torchrun (or a PyTorchJob) describes in the environment.

    Returns (rank, world size, local rank); (0, 1, 0) when the environment describes no group. Raises
    :class:`SettingsError` when the environment describes a group this process cannot join (:func:`launch_problem`).
    """
    problem = launch_problem(os.environ)
    if problem:
        raise SettingsError(problem)
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
