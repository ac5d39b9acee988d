"""One training epoch and one evaluation pass.

A training step is ``accum_steps`` micro-batches (gradients summed, DDP synchronising only on the last), one
gradient clip, one optimizer step, one scheduler step. After every step the loop asks whether any process was
told to stop (SIGTERM) or a checkpoint is due; both happen only at step boundaries, so a checkpoint always
describes a state an uninterrupted run passes through.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dinops.train import dist
from dinops.train.coco_eval import to_coco_detections
from dinops.train.metric_logger import MetricLogger, SmoothedValue
from dinops.train.model_setup import memory_format

log = logging.getLogger("dinops.train")

SHOWN = ("loss", "class_error", "loss_ce", "loss_bbox", "loss_giou")  # on the console; log.txt gets all


@dataclass
class StepState:
    """Where training stands; checkpointed, and advanced by :func:`train_one_epoch`."""

    epoch: int = 0
    step: int = 0  # optimizer steps done in ``epoch``
    global_step: int = 0
    best_ap: float = -1.0


@dataclass(frozen=True)
class StepTiming:
    """Wall time of one optimizer step (waiting for its batches included) and of the wait for its batches."""

    step_s: float
    data_wait_s: float


@dataclass
class Hooks:
    """What the loop calls out to: stop requests, checkpoints, per-step scalars and timing, the profiler."""

    should_stop: Callable[[], bool]
    save_latest: Callable[[StepState], None]
    on_step: Callable[[StepState, dict[str, float], StepTiming], None] = lambda state, values, timing: None
    profiler: Any = None


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    if amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def _to_device(targets: list[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    return [{k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in t.items()} for t in targets]


def box_count_scales(local_boxes: list[int], device: torch.device) -> list[float]:
    """Loss factors that make a step normalise by the boxes of the whole global batch, as one big batch would.

    The criterion divides each micro-batch's loss by its own box count; DINO divides by the mean count per
    process over all processes (and DDP averages the gradients). Scaling micro-batch ``m`` by
    ``n_m / (N / (processes x micro-batches)) / micro-batches`` gives exactly that, for any split into
    processes and accumulated micro-batches (``N`` = boxes in the global batch).
    """
    total = float(sum(local_boxes))
    if dist.is_distributed():
        t = torch.tensor([total], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        total = float(t.item())
    parts = dist.world_size() * len(local_boxes)
    mean = max(total / parts, 1.0)
    return [max(n, 1) / mean / len(local_boxes) for n in local_boxes]


def accumulate(
    step_values: dict[str, float],
    loss_dict: dict[str, torch.Tensor],
    weights: dict[str, float],
    loss: float,
    micro_batches: int,
) -> None:
    """Add one micro-batch's losses (weighted, and ``*_unscaled``), averaged over the micro-batches of a step."""
    keys = list(loss_dict)
    values = torch.stack([loss_dict[k].detach().float() for k in keys]).tolist()  # one device sync, not one per loss
    for k, v in zip(keys, values, strict=True):
        if k in weights:
            step_values[k] = step_values.get(k, 0.0) + v * weights[k] / micro_batches
            step_values[f"{k}_unscaled"] = step_values.get(f"{k}_unscaled", 0.0) + v / micro_batches
        else:
            step_values[k] = step_values.get(k, 0.0) + v / micro_batches
    step_values["loss"] = step_values.get("loss", 0.0) + loss / micro_batches


def train_one_epoch(
    model: torch.nn.Module,
    criterion: torch.nn.Module,
    loader: torch.utils.data.DataLoader,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    device: torch.device,
    state: StepState,
    args: Any,
    steps_per_epoch: int,
    hooks: Hooks,
) -> tuple[dict[str, float], str]:
    """Train from ``state.step`` to the end of ``state.epoch``.

    Returns the epoch's averages and why it returned: ``"epoch_end"``, ``"signal"`` (a process was told to stop;
    the latest checkpoint is written) or ``"max_steps"`` (``--max-steps`` reached mid-epoch; checkpoint written).
    """
    model.train()
    criterion.train()
    metrics = MetricLogger(shown=("lr", *SHOWN))
    metrics.add_meter("lr", SmoothedValue(window=1, fmt="{value:.6f}"))
    weights = criterion.weight_dict
    header = f"Epoch: [{state.epoch}]"
    batches = iter(loader)
    layout = memory_format(args, device)
    for _ in metrics.log_every(
        range(state.step, steps_per_epoch), steps_per_epoch, args.print_freq, header, start=state.step
    ):
        began = time.perf_counter()
        window = [next(batches) for _ in range(args.accum_steps)]
        data_wait_s = time.perf_counter() - began
        local_boxes = [sum(len(t["labels"]) for t in targets) for _, _, targets in window]
        scales = box_count_scales(local_boxes, device)
        step_values: dict[str, float] = {}
        for micro, (images, mask, targets) in enumerate(window):
            images = images.to(device, non_blocking=True, memory_format=layout)
            mask = mask.to(device, non_blocking=True)
            targets = _to_device(targets, device)
            last = micro == len(window) - 1
            sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
            with sync:
                with autocast(device, args.amp):
                    outputs = model(images, mask, targets=targets)
                    loss_dict = criterion(outputs, targets)
                loss = sum(loss_dict[k] * weights[k] for k in loss_dict if k in weights)
                scaler.scale(loss * scales[micro]).backward()
            accumulate(step_values, loss_dict, weights, float(loss.detach()), len(window))
        step_values = dist.mean_over_processes(step_values, device)
        if not math.isfinite(step_values["loss"]):
            raise FloatingPointError(
                f"loss is {step_values['loss']} at epoch {state.epoch} step {state.step}; stopping "
                f"(components: { {k: v for k, v in step_values.items() if not k.endswith('_unscaled')} })"
            )
        if args.clip_max_norm > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_max_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        state.step += 1
        state.global_step += 1
        metrics.update(**step_values)
        metrics.meters["lr"].update(optimizer.param_groups[0]["lr"])
        hooks.on_step(
            state,
            {k: step_values[k] for k in SHOWN if k in step_values} | {"lr": optimizer.param_groups[0]["lr"]},
            StepTiming(time.perf_counter() - began, data_wait_s),
        )
        if hooks.profiler is not None:
            hooks.profiler.step()
        signalled = dist.any_process(hooks.should_stop(), device)
        at_limit = bool(args.max_steps) and state.global_step >= args.max_steps
        mid_epoch = state.step < steps_per_epoch
        due = bool(args.checkpoint_steps) and state.global_step % args.checkpoint_steps == 0
        if mid_epoch and (signalled or at_limit or due):
            hooks.save_latest(state)
        if signalled:
            return metrics.global_averages(), "signal"
        if at_limit and mid_epoch:
            return metrics.global_averages(), "max_steps"
    return metrics.global_averages(), "epoch_end"


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    postprocess: Callable,
    loader: torch.utils.data.DataLoader,
    device: torch.device,
    amp: str,
    num_select: int,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """COCO-format detections of this process's share of ``loader`` (boxes in original image pixels)."""
    model.eval()
    detections: list[dict[str, Any]] = []
    iterator = loader
    if progress and dist.is_main():
        from tqdm import tqdm

        iterator = tqdm(loader, desc="eval", unit="batch")
    for images, mask, targets in iterator:
        with autocast(device, amp):
            outputs = model(images.to(device), mask.to(device))
        outputs = {k: v.float() if torch.is_tensor(v) else v for k, v in outputs.items()}
        sizes = torch.stack([t["orig_size"] for t in targets]).to(device)
        results = postprocess(outputs, sizes, num_select)
        detections += to_coco_detections(results, [t["image_id"] for t in targets])
    return detections
