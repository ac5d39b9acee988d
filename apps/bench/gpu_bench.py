"""GPU benchmark of DINO-4scale R50: the fused Triton deformable attention against the pure path, in one call.

    make gpu-bench                                   # python apps/bench/gpu_bench.py on this machine
    python apps/bench/gpu_bench.py --official-src DINO-checkout   # + the official model with its compiled CUDA op
    python apps/bench/gpu_bench.py --device cpu      # the small CPU shape that `make bench` and a test run

First it checks the fused kernel against the pure path on the device (outputs and the gradients of value, sampling
locations and attention weights, float32, float16 and bfloat16 values) and stops with status 1 before timing anything
if they differ or the kernel fails to compile or launch. Then, each variant after a warm-up, while the time budget
(``--budget-s``, 7 minutes by default: the whole call stays under 8 on an H100 or H200) lasts:

* ``kernel``: the sampling alone, forward + backward, at the encoder's size (B=2, ~18k queries, 8 heads, 4 levels,
  4 points): pure (``gather`` and ``grid_sample``) vs fused (float32 and bfloat16 values);
* ``official``: with ``--official-src`` and ``nvcc`` on a CUDA machine, the official model's fp32 training step with
  its CUDA op compiled here (official_ops.py; compile and steps took 56 s on an H100, so it runs second, while at
  least 90 s of budget are left), and the ratio of each of our training variants to it;
* ``train``: a full training step (denoising queries, criterion, backward, clip, AdamW) at batch 2 on random
  800x1066 images, random init, in fp32, TF32 and bf16 autocast, pure vs fused, and fused TF32 and bf16 with the
  convolutions in channels-last layout: images/s and peak GPU memory;
* ``copy``: the host-to-GPU copy of that batch from pageable and from pinned memory (the loader's ``--pin-memory``);
* ``inference``: latency at batch 1 and 8 (``optimize_for_inference``, fp32 and bf16 autocast) and images/s;
* ``kernel_sweep``: the fused kernel's launch shape (32, 64, 128 queries per program x 2, 4, 8 warps), float32.

"pure" is the ``gather`` backend, the pure path's choice on a GPU whose self-check passes; "fused" the kernel.

A variant that cannot run says why in its ``skipped`` field ("no CUDA", "time budget", "failed: <error>", ...); the
JSON is rewritten after each section, so a run stopped from outside keeps what it measured. On a CPU the model
variants are skipped; the fused check runs there only under ``TRITON_INTERPRET=1`` (Triton's interpreter; its speed
means nothing, so the fused timings are skipped). The table goes to stdout, the JSON to ``--out``
(artifacts/gpu-bench.json). Exit status: 0 done, 1 the fused kernel differs from the pure path.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from dinops.model import DINOConfig, build_criterion, build_dino, pad_images, set_deformable_attention_backend
from dinops.model.ms_deform_attn_core import BACKENDS

log = logging.getLogger("gpu_bench")
PRECISIONS = {"fp32": (False, None), "tf32": (True, None), "bf16": (True, torch.bfloat16)}  # (TF32, autocast dtype)
# max |fused - reference| / max |reference| per tensor, the values rounded to the dtype first: float32 sums leave
# rounding only; float16 and bfloat16 outputs and value gradients are rounded to 11 and 8 significant bits
CHECK_TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}
ENCODER_SHAPES = [(100, 134), (50, 67), (25, 34), (13, 17)]  # the 4 levels of an 800x1066 image


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", default="artifacts/gpu-bench.json", help="JSON file written at the end")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip what would start after this many seconds")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per variant (GPU)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations first (GPU; compiles the kernels)")
    parser.add_argument(
        "--official-src",
        default=os.environ.get("DINO_OFFICIAL_SRC", ""),
        help="checkout of IDEA-Research/DINO (env DINO_OFFICIAL_SRC); needs nvcc and a GPU",
    )
    return parser


class Clock:
    """Elapsed time against the budget, and the synchronised timing of one variant."""

    def __init__(self, device: torch.device, budget_s: float) -> None:
        self.device, self.budget_s, self.began = device, budget_s, time.perf_counter()

    def left(self, margin_s: float = 0.0) -> bool:
        """Whether something expected to take ``margin_s`` more than one variant may still start."""
        return time.perf_counter() - self.began + margin_s < self.budget_s

    def time(self, step, warmup: int, iters: int) -> float:
        """Median seconds of ``step()`` over ``iters`` runs after ``warmup``."""
        times = []
        for index in range(warmup + iters):
            self.sync()
            began = time.perf_counter()
            step()
            self.sync()
            if index >= warmup:
                times.append(time.perf_counter() - began)
        return sorted(times)[len(times) // 2]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def attention_inputs(device, shapes, batch, queries, heads=8, channels=32, points=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(h * w for h, w in shapes)
    value = torch.randn(batch, tokens, heads, channels, generator=gen)
    locations = torch.rand(batch, queries, heads, len(shapes), points, 2, generator=gen) * 1.2 - 0.1
    weights = torch.rand(batch, queries, heads, len(shapes), points, generator=gen)
    grad = torch.randn(batch, queries, heads * channels, generator=gen)
    return [t.to(device) for t in (value, locations, weights, grad)]


def fwd_bwd(name, shapes, value, locations, weights, grad):
    leaves = [t.detach().clone().requires_grad_() for t in (value, locations, weights)]
    output = BACKENDS[name](leaves[0], shapes, leaves[1], leaves[2])
    output.backward(grad.to(output.dtype))
    return [output] + [leaf.grad for leaf in leaves]


def check_fused(device: torch.device, shapes, batch: int, queries: int, **sizes) -> dict:
    """Relative max errors of the fused kernel against ``grid_sample`` in float64 on ``device``."""
    value, locations, weights, grad = attention_inputs(device, shapes, batch, queries, **sizes)
    result = {"shapes": shapes, "batch": batch, "queries": queries, **sizes, "tolerance": CHECK_TOLERANCE}
    for name in CHECK_TOLERANCE:
        dtype = getattr(torch, name)
        rounded, rounded_grad = value.to(dtype), grad.to(dtype)
        expected = fwd_bwd("grid_sample", shapes, rounded.double(), locations.double(), weights.double(), rounded_grad)
        got = fwd_bwd("triton", shapes, rounded, locations, weights, rounded_grad)
        errors = {
            name: float((a.detach().double() - b.detach()).abs().max() / b.detach().abs().max().clamp_min(1e-30))
            for name, a, b in zip(("output", "value", "locations", "weights"), got, expected, strict=True)
        }
        result[name] = errors
    result["passed"] = all(max(result[k].values()) <= tol for k, tol in CHECK_TOLERANCE.items())
    return result


def kernel_times(clock: Clock, args, shapes, batch: int, queries: int) -> dict:
    value, locations, weights, grad = attention_inputs(clock.device, shapes, batch, queries)
    result = {"shapes": shapes, "batch": batch, "queries": queries, "unit": "ms forward+backward"}
    for label, name, dtype in (
        ("gather", "gather", torch.float32),
        ("grid_sample", "grid_sample", torch.float32),
        ("fused_fp32", "triton", torch.float32),
        ("fused_bf16", "triton", torch.bfloat16),
    ):
        if not clock.left():
            result[label] = {"skipped": "time budget"}
            continue
        step = functools.partial(fwd_bwd, name, shapes, value.to(dtype), locations, weights, grad)
        result[label] = {"ms": round(1e3 * clock.time(step, args.warmup, args.iters), 3)}
    return result


def kernel_sweep(clock: Clock, args, shapes, batch: int, queries: int) -> dict:
    """The fused kernel's launch shape (queries per program, warps) at the encoder's size, float32: forward alone and
    forward + backward, median ms; the kernel's defaults are restored afterwards."""
    from dinops.model import ms_deform_attn_triton as fused

    value, locations, weights, grad = attention_inputs(clock.device, shapes, batch, queries)
    defaults = fused.BLOCK_Q, fused.NUM_WARPS
    result = {"default": {"block_q": defaults[0], "num_warps": defaults[1]}, "unit": "ms"}
    try:
        for block_q in (32, 64, 128):
            for warps in (2, 4, 8):
                label = f"block_q{block_q}_warps{warps}"
                if not clock.left():
                    result[label] = {"skipped": "time budget"}
                    continue
                fused.BLOCK_Q, fused.NUM_WARPS = block_q, warps
                with torch.no_grad():
                    forward = clock.time(lambda: BACKENDS["triton"](value, shapes, locations, weights), 2, args.iters)
                both = clock.time(
                    functools.partial(fwd_bwd, "triton", shapes, value, locations, weights, grad), 2, args.iters
                )
                result[label] = {"forward_ms": round(1e3 * forward, 3), "forward_backward_ms": round(1e3 * both, 3)}
    finally:
        fused.BLOCK_Q, fused.NUM_WARPS = defaults
    return result


def _precision(name: str):
    """Set TF32 for precision ``name``; returns a function giving its autocast context (a fresh one per step)."""
    tf32, amp = PRECISIONS[name]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    return (lambda: torch.autocast("cuda", dtype=amp)) if amp else contextlib.nullcontext


def _train_step(model, criterion, optimizer, autocast, padded, mask, targets):
    def step():
        with autocast():
            losses = criterion(model(padded, mask, targets=targets), targets)
        loss = sum(losses[k] * criterion.weight_dict[k] for k in losses if k in criterion.weight_dict)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _inference(model, autocast, images, mask):
    def forward():
        with torch.inference_mode(), autocast():
            model(images, mask)

    return forward


def train_times(clock: Clock, args, size: tuple[int, int]) -> dict:
    """Images/s and peak memory of a training step at batch 2, per precision and backend."""
    from bench_train import random_batch  # same directory: the batch of bench_train.py

    device, cfg = clock.device, DINOConfig.dino_4scale_r50()
    torch.manual_seed(0)
    model, criterion = build_dino(cfg).to(device).train(), build_criterion(cfg).to(device)
    initial = copy.deepcopy(model.state_dict())
    images, targets = random_batch(2, *size, cfg.num_classes, torch.Generator().manual_seed(0))
    padded, mask = (t.to(device) for t in pad_images(images))
    targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
    result = {"batch": 2, "image_size": list(size)}
    variants = [(precision, backend, False) for precision in PRECISIONS for backend in ("gather", "triton")]
    variants += [("tf32", "triton", True), ("bf16", "triton", True)]  # the convolutions in channels-last layout
    for precision, backend, channels_last in variants:
        label = f"{precision}_{'fused' if backend == 'triton' else 'pure'}{'_channels_last' if channels_last else ''}"
        if not clock.left():
            result[label] = {"skipped": "time budget"}
            continue
        layout = torch.channels_last if channels_last else torch.contiguous_format
        model.to(memory_format=layout).load_state_dict(initial)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
        set_deformable_attention_backend(backend)
        inputs = padded.contiguous(memory_format=layout)
        step = _train_step(model, criterion, optimizer, _precision(precision), inputs, mask, targets)
        torch.cuda.reset_peak_memory_stats(device)
        seconds = clock.time(step, args.warmup, args.iters)
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        result[label] = {"images_per_s": round(2 / seconds, 2), "peak_gib": round(peak, 2), "backend": backend}
    set_deformable_attention_backend(None)
    return result


def copy_times(clock: Clock, args, size: tuple[int, int]) -> dict:
    """Host-to-GPU copy of a padded batch of 2 (float32) from pageable and from pinned memory (``--pin-memory``)."""
    batch = torch.randn(2, 3, *size)
    result = {"bytes": batch.numel() * batch.element_size(), "unit": "ms per copy"}
    for label, source in (("pageable", batch), ("pinned", batch.pin_memory())):
        step = functools.partial(source.to, clock.device, non_blocking=True)
        result[label] = {"ms": round(1e3 * clock.time(step, args.warmup, args.iters), 3)}
    return result


def inference_times(clock: Clock, args, size: tuple[int, int]) -> dict:
    from dinops.model.inference import optimize_for_inference

    device = clock.device
    torch.manual_seed(0)
    model = optimize_for_inference(build_dino(DINOConfig.dino_4scale_r50()).to(device))
    result = {"image_size": list(size)}
    for precision in ("fp32", "bf16"):
        for batch in (1, 8):
            images = torch.randn(batch, 3, *size, device=device)
            mask = torch.zeros(batch, *size, dtype=torch.bool, device=device)
            for backend in ("gather", "triton"):
                label = f"{precision}_batch{batch}_{'fused' if backend == 'triton' else 'pure'}"
                if not clock.left():
                    result[label] = {"skipped": "time budget"}
                    continue
                set_deformable_attention_backend(backend)
                forward = _inference(model, _precision(precision), images, mask)
                seconds = clock.time(forward, args.warmup, args.iters)
                result[label] = {"latency_ms": round(1e3 * seconds, 1), "images_per_s": round(batch / seconds, 2)}
    set_deformable_attention_backend(None)
    return result


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    clock = Clock(device, args.budget_s)
    gpu = device.type == "cuda"
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    report = {
        "device": torch.cuda.get_device_name(device) if gpu else "CPU",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
    }
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    no_fused = None if gpu or interpreted else "no CUDA (TRITON_INTERPRET=1 runs the fused check in the interpreter)"
    if report["triton"] is None:
        no_fused = "Triton is not installed"
    if no_fused:
        report["fused_check"] = {"skipped": no_fused}
    else:
        shapes, sizes = (ENCODER_SHAPES, (2, 2000)) if gpu else ([(6, 5), (3, 2)], (2, 20))
        small = {} if gpu else {"heads": 2, "channels": 8, "points": 2}
        try:
            report["fused_check"] = check_fused(device, shapes, *sizes, **small)
        except Exception as exc:  # the kernel does not compile or launch here: as good as a wrong result
            log.exception("the fused check failed")
            report["fused_check"] = {"passed": False, "error": f"{exc!r}"[:800]}
    save(report, args.out)
    if not report["fused_check"].get("passed", True):
        return report
    if not gpu:
        skipped = {"skipped": "no CUDA: model timings need a GPU (the interpreter's speed means nothing)"}
        report.update(kernel=skipped, train=skipped, copy=skipped, inference=skipped, official=skipped)
        report["kernel_sweep"] = skipped
        return report
    from official_ops import official_ratios, official_train_time

    tokens = sum(h * w for h, w in ENCODER_SHAPES)  # the encoder's queries: one per token
    sections = {  # the official step before ours: its compile must not be what the budget cuts (first GPU run)
        "kernel": lambda: kernel_times(clock, args, ENCODER_SHAPES, 2, tokens),
        "official": lambda: official_train_time(clock, args, (800, 1066)),
        "train": lambda: train_times(clock, args, (800, 1066)),
        "copy": lambda: copy_times(clock, args, (800, 1066)),
        "inference": lambda: inference_times(clock, args, (800, 1066)),
        "kernel_sweep": lambda: kernel_sweep(clock, args, ENCODER_SHAPES, 2, tokens),
    }
    for name, measure in sections.items():
        try:
            report[name] = measure()
        except Exception as exc:  # e.g. the official code on this machine's packages: keep the other figures
            log.exception("section %s failed", name)
            report[name] = {"skipped": f"failed: {exc!r}"[:800]}
        set_deformable_attention_backend(None)
        torch.cuda.empty_cache()
        save(report, args.out)
    report["official"].update(official_ratios(report["official"], report["train"]))
    return report  # main() writes it


def save(report: dict, out: str) -> None:
    """Write the report so far (a run cut short by its caller's time limit keeps what it measured)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def table(report: dict) -> str:
    lines = [f"device {report['device']}, torch {report['torch']}, triton {report['triton']}, {report['date']}"]
    check = report["fused_check"]
    if "passed" in check:
        lines.append(f"fused vs pure: {'PASSED' if check['passed'] else 'FAILED'} (relative max errors)")
        lines += [f"  {dtype:9} " + json.dumps(check[dtype]) for dtype in CHECK_TOLERANCE if dtype in check]
        lines += [f"  error     {check['error']}"] if "error" in check else []
    else:
        lines.append(f"fused vs pure: skipped ({check['skipped']})")
    for section in ("kernel", "train", "copy", "official", "inference", "kernel_sweep"):
        entries = report.get(section, {"skipped": "fused check failed"})
        if "skipped" in entries:
            lines.append(f"{section}: skipped ({entries['skipped']})")
            continue
        lines.append(f"{section}:")
        for key, value in entries.items():
            if isinstance(value, dict):
                lines.append(f"  {key:24} " + ", ".join(f"{k} {v}" for k, v in value.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    report = run(args)
    sys.stdout.write(table(report) + "\n")
    save(report, args.out)
    log.info("wrote %s", args.out)
    return 0 if report["fused_check"].get("passed", True) else 1


if __name__ == "__main__":
    sys.exit(main())
