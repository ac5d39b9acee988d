"""`dinops train`: train DINO on a COCO-format dataset, in one process or under torchrun.

Single process (CPU or one GPU)::

    dinops train --data-root data/coco --output-dir out/r50

Several GPUs on one node (NCCL), or several CPU processes (gloo)::

    torchrun --nproc-per-node 4 -m dinops.train.main --data-root data/coco --output-dir out/r50

Every setting is a flag and a ``DINO_*`` environment variable (flag > environment > default; unknown
``DINO_*`` variables are an error); ``dinops train --help`` lists them and docs/training.md has the table.
The resolved configuration goes to ``OUTPUT_DIR/config.json``.

Resuming: ``--resume auto`` continues from ``OUTPUT_DIR/checkpoint.pth`` when it exists (a fresh start when
not), restoring model, optimizer, scheduler, scaler, epoch, step within the epoch, sampler position and RNG
state. The latest checkpoint is rewritten atomically at each epoch end and every ``--checkpoint-steps``
optimizer steps. SIGTERM (pod eviction, preemption) lets the current step finish, writes the checkpoint and
exits 128 + the signal number (143), never 0: a pod that exits 0 counts as a completed Job, so an evicted run
would end there instead of being retried; its retry continues where it stopped.

S3 (``--output-s3 s3://bucket/prefix``): checkpoints, ``log.txt`` and ``config.json`` are also uploaded as they are
written, the latest pointer (``latest.json``) last; ``--resume auto`` on a new VM fetches the latest checkpoint from
there. Access (listing and writing) is checked before training starts (exit 2); uploads that fail are retried while
training goes on, for at most ``--s3-retry-minutes``; S3 unreachable for longer stops training with exit status 75
(EX_TEMPFAIL), any other upload error with 1 (see :mod:`dinops.train.s3_output`).

Evaluation only: ``--eval true --resume PATH`` (or ``dinops eval``). Reports: console lines with ETA
(``console.log``), ``log.txt`` (one JSON line per epoch, official DINO field names), TensorBoard events,
``<timestamp> name=value ...`` metric lines on stdout for Katib (process 0 only), optional profiler traces
(``--profile-steps``), and the live state for the API and the web client: ``progress.json`` and Prometheus metrics on
``--metrics-port`` (process 0 only; :mod:`dinops.train.monitor`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import signal
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from dinops.data.cache import CacheBudget
from dinops.data.coco import AnnotationError, CocoDetection
from dinops.data.loader import ResumableBatchSampler, collate
from dinops.data.ready import EXTRA_SETTINGS
from dinops.data.settings import fill_data_paths
from dinops.data.transforms import eval_transforms, train_transforms
from dinops.s3 import S3Error, parse_url
from dinops.settings import SettingsError, add_arguments, check_unknown_env, resolve
from dinops.train import checkpoints, dist
from dinops.train.coco_eval import STAT_NAMES, evaluate
from dinops.train.engine import Hooks, StepState, StepTiming, predict, train_one_epoch
from dinops.train.logs import TensorBoard, append_log_txt, metric_line, setup_logging, teardown_logging
from dinops.train.model_setup import lr_factor, memory_format, model_config, param_groups
from dinops.train.monitor import Monitor
from dinops.train.s3_output import EXIT_S3_UNREACHABLE, S3Output, S3Unreachable
from dinops.train.settings import ENV_PREFIX, MODEL_ENV, SETTINGS

log = logging.getLogger("dinops.train")
metrics_out = logging.getLogger("dinops.metrics")  # `<timestamp> name=value ...` lines on stdout for Katib
# The metric names of the Katib Experiment (objective bbox_ap), the first three COCO numbers (coco_eval.STAT_NAMES).
KATIB_AP_NAMES = ("bbox_ap", "bbox_ap50", "bbox_ap75")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dinops train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, SETTINGS)
    return parser


def int_list(text: str, name: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SettingsError(f"{name}={text!r}: expected comma-separated integers") from None


def parse_args(argv: list[str] | None, environ: dict[str, str] | None = None) -> argparse.Namespace:
    """Flags, then DINO_* variables, then defaults; reject unknown variables and unusable values."""
    environ = dict(os.environ) if environ is None else environ
    args = get_args_parser().parse_args(argv)
    check_unknown_env(SETTINGS + EXTRA_SETTINGS + MODEL_ENV, (ENV_PREFIX,), environ)
    args = resolve(args, SETTINGS, environ)
    resolve(argparse.Namespace(), MODEL_ENV, environ)  # the model reads these itself: a bad value stops here, not later
    fill_data_paths(args)
    args.train_scales_list = int_list(args.train_scales, "--train-scales")
    args.crop_scales_list = int_list(args.crop_scales, "--crop-scales")
    args.crop_size_list = int_list(args.crop_size, "--crop-size")
    args.lr_drop_list = int_list(args.lr_drop, "--lr-drop")
    problems = []
    for name in ("epochs", "batch_size", "accum_steps", "max_size", "eval_size"):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1")
    for name in (
        "num_workers",
        "checkpoint_steps",
        "eval_every",
        "max_steps",
        "profile_steps",
        "warmup_steps",
        "num_select",
    ):
        if getattr(args, name) < 0:
            problems.append(f"--{name.replace('_', '-')} must be >= 0")
    if args.metrics_port > 65535:
        problems.append("--metrics-port must be a TCP port (0 = off)")
    if args.checkpoint_every < 1:
        problems.append("--checkpoint-every must be >= 1")
    if len(args.crop_size_list) != 2 or args.crop_size_list[0] > args.crop_size_list[1]:
        problems.append("--crop-size needs two integers MIN,MAX with MIN <= MAX")
    if not args.train_scales_list or not args.crop_scales_list:
        problems.append("--train-scales and --crop-scales need at least one size")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        problems.append("--device cuda but no GPU is visible")
    if args.amp == "fp16" and not cuda:
        problems.append("--amp fp16 needs a GPU (use bf16 or none on CPU)")
    if args.eval and not (args.resume or args.pretrained):
        problems.append("--eval needs a model: --resume PATH or --pretrained PATH")
    for name in ("pretrained", "backbone_weights"):
        if getattr(args, name) and not Path(getattr(args, name)).is_file():
            problems.append(f"--{name.replace('_', '-')} {getattr(args, name)}: no such file")
    if args.output_s3:
        try:
            parse_url(args.output_s3, "--output-s3 (DINO_OUTPUT_S3)")
        except S3Error as exc:
            problems.append(str(exc))
    endpoint = urllib.parse.urlparse(args.s3_endpoint)
    if args.s3_endpoint and (endpoint.scheme not in ("http", "https") or not endpoint.netloc):
        problems.append(f"--s3-endpoint (DINO_S3_ENDPOINT) {args.s3_endpoint!r}: expected http(s)://host[:port]")
    if problems:
        raise SettingsError("; ".join(problems))
    return args


def setup_device(args: argparse.Namespace) -> torch.device:
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def seed_everything(seed: int, deterministic: bool) -> None:
    import random

    import numpy as np

    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def build_loaders(args: argparse.Namespace, world: int, rank: int, device: torch.device):
    cache_budget = CacheBudget(args.cache_max_gb)  # shared by both splits, the training split first
    train_set = CocoDetection(
        args.train_images,
        args.train_annotations,
        train_transforms(args.train_scales_list, args.max_size, args.crop_scales_list, tuple(args.crop_size_list)),
        seed=args.seed,
        cache_dir=args.cache_dir or None,
        cache_budget=cache_budget,
    )
    val_set = CocoDetection(
        args.val_images,
        args.val_annotations,
        eval_transforms(args.eval_size, args.max_size),
        cache_dir=args.cache_dir or None,
        cache_budget=cache_budget,
    )
    try:
        train_sampler = ResumableBatchSampler(
            len(train_set), args.batch_size, num_replicas=world, rank=rank, seed=args.seed
        )
    except ValueError as exc:  # fewer images than one global batch
        raise SettingsError(f"{args.train_annotations}: {exc}") from None
    val_sampler = ResumableBatchSampler(
        len(val_set), args.batch_size, num_replicas=world, rank=rank, shuffle=False, drop_last=False
    )
    common = {
        "collate_fn": collate,
        "num_workers": args.num_workers,
        "pin_memory": args.pin_memory and device.type == "cuda",
        "generator": torch.Generator(),  # the loader's seeds never draw from the global RNG a resume restores
    }
    return (
        train_set,
        val_set,
        DataLoader(train_set, batch_sampler=train_sampler, **common),
        DataLoader(val_set, batch_sampler=val_sampler, **common),
    )


class StopRequest:
    """Remembers SIGTERM/SIGINT; the training loop finishes its step, checkpoints and exits 128 + signal number.

    The status is not 0 because training did not finish: Kubernetes counts a pod that exits 0 as a completed Job
    and would not retry it. A second signal exits at once (the same status) without writing a checkpoint.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signum = 0
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second signal (Ctrl-C twice): stop now, the last checkpoint stays
            log.warning("second %s: exiting without a new checkpoint", signal.Signals(signum).name)
            raise SystemExit(128 + signum)
        self.requested = True
        self.signum = signum
        log.warning(
            "received %s: finishing this step, then writing a checkpoint and exiting", signal.Signals(signum).name
        )


def run_evaluation(model, postprocess, val_set, val_loader, device, args) -> tuple[list[float], list[dict]]:
    detections = predict(model, postprocess, val_loader, device, args.amp, args.num_select, args.progress)
    gathered = [d for part in dist.all_gather_object(detections) for d in part]
    stats, table = evaluate(val_set.document, gathered) if dist.is_main() else ([], "")
    if dist.is_main():
        log.info("bbox evaluation on %s (%d images):\n%s", args.val_annotations, len(val_set), table)
    return dist.broadcast_object(stats), gathered


def train(args: argparse.Namespace) -> int:
    """Train (or evaluate, with ``--eval``) while process 0 reports the run (:mod:`dinops.train.monitor`)."""
    rank = int(os.environ.get("RANK", "0"))  # torchrun's; the process group does not exist yet
    monitor = Monitor(args.output_dir, args.metrics_port, active=rank == 0 and not args.eval)
    try:
        status = _train(args, monitor)
    except BaseException as exc:
        monitor.state("failed", f"{type(exc).__name__}: {exc}")
        raise
    else:
        monitor.state("done" if status == 0 else "stopped", None if status == 0 else f"exit status {status}")
        return status
    finally:
        monitor.close()


def _train(args: argparse.Namespace, monitor: Monitor) -> int:
    from dinops.model import build_criterion, build_dino, load_checkpoint, postprocess

    device = setup_device(args)
    rank, world, _ = dist.init_distributed(device.type)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(output_dir, rank == 0)
    seed_everything(args.seed + rank, args.deterministic)
    mirror = S3Output.start(args, output_dir, rank)  # before any data is read: a bad bucket is a usage error
    if args.resume == "auto":
        mirror.restore()  # a new VM: the latest checkpoint from S3 into OUTPUT_DIR

    train_set, val_set, train_loader, val_loader = build_loaders(args, world, rank, device)
    num_classes = args.num_classes or train_set.num_classes
    cfg = model_config(args, num_classes, max(train_set.dn_labelbook_size, num_classes))
    args.model_cfg = cfg.to_dict()
    args.num_select = args.num_select or cfg.num_select
    model = build_dino(cfg).to(device, memory_format=memory_format(args, device))
    criterion = build_criterion(cfg).to(device)
    if args.pretrained:
        load_checkpoint(model, args.pretrained, num_classes=num_classes)
        log.info("initialised from %s", args.pretrained)
    n_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    bare = model
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True
        )

    global_batch = args.batch_size * args.accum_steps * world
    steps_per_epoch = train_loader.batch_sampler.batches_per_epoch() // args.accum_steps
    if steps_per_epoch < 1:
        raise SettingsError(f"one epoch of {len(train_set)} images holds no step of {global_batch} images")
    # fused: one kernel for all parameters (about 5x faster than the loop on CPU as well)
    optimizer = torch.optim.AdamW(
        param_groups(bare, args.lr, args.lr_backbone), lr=args.lr, weight_decay=args.weight_decay, fused=True
    )
    total_steps = min(args.epochs * steps_per_epoch, args.max_steps or args.epochs * steps_per_epoch)
    monitor.plan(
        device=device, epochs=args.epochs, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
        global_batch=global_batch,
    )  # fmt: skip
    drop_steps = [e * steps_per_epoch for e in args.lr_drop_list]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.warmup_steps, drop_steps))
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")

    state = StepState()
    resume_from = checkpoints.resume_path(args.resume, output_dir)
    if resume_from is not None:
        if args.eval:  # any checkpoint with weights, official ones included
            load_checkpoint(bare, resume_from, num_classes=num_classes)
        else:
            state = checkpoints.restore(
                resume_from, bare, optimizer, scheduler, scaler, args.model_cfg, global_batch, rank
            )
            mirror.catch_up(state)
            monitor.resumed(state.global_step)
        log.info("resumed from %s at epoch %d step %d", resume_from, state.epoch, state.step)

    if rank == 0:
        resolved = {k: v for k, v in vars(args).items()} | {
            "world_size": world,
            "global_batch": global_batch,
            "n_parameters": n_parameters,
        }
        (output_dir / "config.json").write_text(json.dumps(resolved, indent=2, default=str))
        mirror.file(output_dir / "config.json")
    log.info(
        "model %s: %d trainable parameters; %d steps of %d images per epoch",
        args.model,
        n_parameters,
        steps_per_epoch,
        global_batch,
    )

    if args.eval:
        stats, detections = run_evaluation(model, postprocess, val_set, val_loader, device, args)
        if rank == 0:
            (output_dir / "eval.json").write_text(
                json.dumps({"stats": dict(zip(STAT_NAMES, stats, strict=True)), "detections": detections})
            )
            metrics_out.info(metric_line(dict(zip(KATIB_AP_NAMES, stats, strict=False))))
            mirror.file(output_dir / "eval.json")
        mirror.finish()
        dist.shutdown()
        return 0

    stop = StopRequest()
    tensorboard = TensorBoard(output_dir, args.tensorboard and rank == 0)

    def save_latest(s: StepState) -> None:
        ckpt = checkpoints.training_state(
            bare, optimizer, scheduler, scaler, s, args, global_batch, train_set.categories
        )
        if rank == 0:
            checkpoints.save_atomic(ckpt, output_dir / checkpoints.LATEST)
            log.info("checkpoint: epoch %d step %d -> %s", s.epoch, s.step, output_dir / checkpoints.LATEST)
            mirror.checkpoint(output_dir / checkpoints.LATEST, s)
            monitor.checkpointed(output_dir / checkpoints.LATEST, s.epoch, s.global_step)
        dist.barrier()
        mirror.raise_if_failed()  # an earlier upload failed: stop now, with this checkpoint written locally

    def on_step(s: StepState, values: dict[str, float], timing: StepTiming) -> None:
        tensorboard.scalars("train", values, s.global_step)
        monitor.step(s, values, timing)

    hooks = Hooks(should_stop=lambda: stop.requested, save_latest=save_latest, on_step=on_step)
    profiler = None
    if args.profile_steps and rank == 0:
        profiler = torch.profiler.profile(
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=args.profile_steps, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(output_dir / "profile")),
        )
        profiler.start()
        hooks.profiler = profiler

    began = time.time()
    status = 0
    monitor.state("training", epoch=state.epoch, step=state.step, global_step=state.global_step)
    while state.epoch < args.epochs:
        epoch_began = time.time()
        train_loader.batch_sampler.set_epoch(state.epoch, state.step * args.accum_steps)
        train_set.set_epoch(state.epoch)
        train_stats, reason = train_one_epoch(
            model, criterion, train_loader, optimizer, scheduler, scaler, device, state, args, steps_per_epoch, hooks
        )
        if reason == "signal":
            if state.step == steps_per_epoch:  # the last step of an epoch: its evaluation runs after the resume
                save_latest(state)
            log.info("stopped at epoch %d step %d; `--resume auto` continues from here", state.epoch, state.step)
            status = 128 + (stop.signum or signal.SIGTERM)  # a process stopped by another's signal says SIGTERM
            break
        if reason == "max_steps":
            log.info("reached --max-steps %d at epoch %d step %d", args.max_steps, state.epoch, state.step)
            break
        state.epoch, state.step = state.epoch + 1, 0
        record: dict[str, Any] = {f"train_{k}": v for k, v in train_stats.items()}
        finished = state.epoch == args.epochs or (args.max_steps and state.global_step >= args.max_steps)
        if args.eval_every and (state.epoch % args.eval_every == 0 or finished):
            monitor.state("evaluating")
            stats, _ = run_evaluation(model, postprocess, val_set, val_loader, device, args)
            monitor.evaluated(state.epoch - 1, state.global_step, stats)
            if not finished:
                monitor.state("training", epoch=state.epoch, step=0)
            record["test_coco_eval_bbox"] = stats
            if stats[0] > state.best_ap:
                state.best_ap = stats[0]
                ckpt = checkpoints.training_state(
                    bare, optimizer, scheduler, scaler, state, args, global_batch, train_set.categories
                )
                if rank == 0:
                    checkpoints.save_atomic(ckpt, output_dir / checkpoints.BEST)
                    mirror.checkpoint(output_dir / checkpoints.BEST)
        record |= {
            "epoch": state.epoch - 1,
            "n_parameters": n_parameters,
            "now_time": str(datetime.datetime.now()),
            "epoch_time": str(datetime.timedelta(seconds=int(time.time() - epoch_began))),
        }
        save_latest(state)
        if rank == 0:
            if state.epoch % args.checkpoint_every == 0 or (state.epoch in args.lr_drop_list):
                numbered = checkpoints.keep_copy(
                    output_dir / checkpoints.LATEST, output_dir / checkpoints.numbered(state.epoch - 1)
                )
                mirror.checkpoint(numbered)
            append_log_txt(output_dir, record)
            mirror.file(output_dir / "log.txt")
            epoch_values = {"epoch": state.epoch - 1, "loss": train_stats.get("loss", math.nan)}
            epoch_values |= dict(zip(KATIB_AP_NAMES, record.get("test_coco_eval_bbox", []), strict=False))
            tensorboard.scalars("epoch", epoch_values, state.epoch - 1)
            metrics_out.info(metric_line(epoch_values))
        if finished:
            break
    if profiler is not None:
        profiler.stop()
    tensorboard.close()
    log.info("training time %.1f s", time.time() - began)
    mirror.finish()  # every upload done (retried within --s3-retry-minutes), else exit 75 or 1, never 0
    dist.shutdown()
    return status


def main(argv: list[str] | None = None) -> int:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    metrics_out.handlers[:] = [handler]
    metrics_out.propagate = False
    metrics_out.setLevel(logging.INFO)
    setup_logging(None, True)
    try:
        args = parse_args(argv)
        return train(args)
    except (SettingsError, AnnotationError, FileNotFoundError) as exc:
        log.error("dinops train: %s", exc)
        return 2
    except S3Unreachable as exc:
        log.error("dinops train: %s", exc)
        return EXIT_S3_UNREACHABLE
    except (FloatingPointError, S3Error) as exc:
        log.error("dinops train: %s", exc)
        return 1
    finally:
        teardown_logging()


if __name__ == "__main__":
    sys.exit(main())
