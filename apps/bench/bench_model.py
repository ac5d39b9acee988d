"""DINO-4scale R50 inference at 800x1066, batch 1: dinops' fast path vs its reference path vs the official model.

Every variant runs in its own process (so that each peak RSS is its own) with the same weights (one random
state_dict, loaded strictly), the same image and the same number of threads; the variants alternate, pair after
pair, so that a change in the machine's load hits all alike, and the medians over the pairs are printed, each as a
ratio to the official model (when its checkout is given) and to dinops' reference path::

    python apps/bench/bench_model.py [--pairs 3] [--official-src DINO-checkout] [--threads 2]

Variants: ``official`` (IDEA-Research/DINO at a checkout, see official_dino.py; skipped without one),
``reference`` (``build_dino`` as trained: the pure path), ``fast`` (``optimize_for_inference``), ``bf16`` (the fast
path under bfloat16 autocast; only where the CPU has native bfloat16, otherwise reported as not run and why).
``--device cuda`` runs the dinops variants on a GPU (``--variants reference,fast,tf32,bf16``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads of every variant (default 2)")
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--width", type=int, default=1066)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--scales", type=int, choices=[4, 5], default=4)
    parser.add_argument("--pairs", type=int, default=3, help="alternating rounds over the variants (default 3)")
    parser.add_argument("--runs", type=int, default=2, help="timed forwards per process after a warm-up (best)")
    parser.add_argument("--variants", default="official,reference,fast,bf16")
    parser.add_argument(
        "--official-src",
        default=os.environ.get("DINO_OFFICIAL_SRC", ""),
        help="checkout of IDEA-Research/DINO (env DINO_OFFICIAL_SRC); without it the official variant is skipped",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # variant to run in this process
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    return parser


def peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _config(scales: int):
    from dinops.model import DINOConfig

    return DINOConfig.dino_4scale_r50() if scales == 4 else DINOConfig.dino_5scale_r50()


def _why_not(variant: str, device: torch.device) -> str:
    """Empty when ``variant`` can run here, else the reason."""
    from dinops.model.inference import cpu_bfloat16_supported

    if variant == "bf16" and device.type == "cpu" and not cpu_bfloat16_supported():
        return "this CPU has no native bfloat16 (oneDNN: no AVX-512 BF16 / AMX); emulated it is ~100x slower"
    if variant == "tf32" and device.type != "cuda":
        return "TF32 exists on NVIDIA GPUs only"
    return ""


def child(args: argparse.Namespace) -> dict:
    """Run one variant: warm-up, then ``--runs`` timed forwards; the best time and this process's peak RSS."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    state = torch.load(args.weights, map_location="cpu", weights_only=True)
    images = torch.randn(args.batch, 3, args.height, args.width, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(args.batch, args.height, args.width, dtype=torch.bool)
    images, mask = images.to(device), mask.to(device)
    if args.child == "official":
        import official_dino

        model = official_dino.build_official(args.official_src, official_dino.official_config(args.scales))
        model.load_state_dict(state, strict=True)

        def run():
            return official_dino.forward(model, images, mask)
    else:
        from dinops.model import build_dino
        from dinops.model.inference import optimize_for_inference

        model = build_dino(_config(args.scales)).eval()
        model.load_state_dict(state, strict=True)
        if args.child != "reference":
            optimize_for_inference(model)
        if args.child == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.child == "bf16")

        def run():
            with autocast:
                return model(images, mask)

    del state
    model.to(device)
    times, cpu_times = [], []
    with torch.inference_mode():
        for index in range(args.runs + 1):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, cpu_start = time.perf_counter(), time.process_time()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if index:  # the first forward warms up allocators and kernels
                times.append(time.perf_counter() - start)
                cpu_times.append(time.process_time() - cpu_start)
    result = {"seconds": min(times), "cpu_seconds": min(cpu_times), "peak_rss_mib": peak_rss_mib()}
    if device.type == "cuda":
        result["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
        result["gpu"] = torch.cuda.get_device_name()
    return result


def _run_child(args: argparse.Namespace, variant: str, weights: Path) -> dict:
    command = [sys.executable, __file__, "--child", variant, "--weights", str(weights)]
    for name in ("threads", "height", "width", "batch", "scales", "runs", "official_src", "device"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"variant {variant} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    from dinops.model import build_dino

    device = torch.device(args.device)
    variants, skipped = [], {}
    for variant in (v.strip() for v in args.variants.split(",") if v.strip()):
        if variant not in {"official", "reference", "fast", "bf16", "tf32"}:
            raise SystemExit(f"unknown variant {variant!r}; use official, reference, fast, bf16 or tf32")
        why = _why_not(variant, device)
        if variant == "official" and not args.official_src:
            why = "no checkout given (--official-src or DINO_OFFICIAL_SRC)"
        if why:
            skipped[variant] = why
        else:
            variants.append(variant)
    rounds: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        weights = Path(tmp) / "weights.pt"
        torch.save(build_dino(_config(args.scales)).state_dict(), weights)
        for _ in range(args.pairs):
            for variant in variants:
                rounds[variant].append(_run_child(args, variant, weights))
    baselines = [b for b in ("official", "reference") if b in rounds]
    summary = {
        "model": f"DINO-{args.scales}scale R50",
        "input": f"{args.batch}x3x{args.height}x{args.width}",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else _cpu_name(),
        "threads": args.threads,
        "torch": torch.__version__,
        "pairs": args.pairs,
        "variants": {},
        "skipped": skipped,
    }
    for variant, results in rounds.items():
        row = {key: round(statistics.median(r[key] for r in results), 3) for key in results[0] if key != "gpu"}
        row["seconds_each"] = [round(r["seconds"], 3) for r in results]
        for baseline in baselines:  # the median of the per-pair ratios: both measured in the same round
            ratios = [r["seconds"] / b["seconds"] for r, b in zip(results, rounds[baseline], strict=True)]
            row[f"vs_{baseline}"] = round(statistics.median(ratios), 3)
        summary["variants"][variant] = row
    if args.json:
        print(json.dumps(summary))
        return 0
    head = [summary["model"], summary["input"], summary["device"], f"{args.threads} threads"]
    head.append(f"torch {torch.__version__}")
    print(", ".join(head))
    print(f"median of {args.pairs} alternating rounds, each the best of {args.runs} forwards after a warm-up")
    header = f"{'variant':>10} {'s/image':>8} {'CPU s':>7} {'peak RSS MiB':>13}"
    print(header + "".join(f" {'vs ' + b:>13}" for b in baselines))
    for variant, row in summary["variants"].items():
        line = f"{variant:>10} {row['seconds']:>8.3f} {row['cpu_seconds']:>7.2f} {row['peak_rss_mib']:>13.0f}"
        print(line + "".join(f" {row.get('vs_' + b, 0):>12.3f}x" for b in baselines))
    for variant, why in skipped.items():
        print(f"{variant:>10} not run: {why}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {torch.backends.cpu.get_cpu_capability()}"
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability()


if __name__ == "__main__":
    sys.exit(main())
