"""CPU benchmark of the full DINO-4scale R50 forward at 800x1066, batch 1 (random weights).

Prints images/s and the process's peak resident memory. ``make bench`` runs it as
``python apps/bench/bench_model.py``; see ``--help`` for the knobs (threads, size, backend, runs).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time

import torch

from dinops.model import DINOConfig, build_dino, deformable_attention_backend, set_deformable_attention_backend


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--width", type=int, default=1066)
    parser.add_argument("--runs", type=int, default=3, help="timed forwards after one warm-up (default 3)")
    parser.add_argument(
        "--backend", choices=["auto", "gather", "grid_sample"], default="auto", help="deformable attention"
    )
    parser.add_argument("--scales", type=int, choices=[4, 5], default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="autocast dtype on GPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.backend != "auto":
        set_deformable_attention_backend(args.backend)
    cfg = DINOConfig.dino_4scale_r50() if args.scales == 4 else DINOConfig.dino_5scale_r50()
    device = torch.device(args.device)
    model = build_dino(cfg).eval().to(device)
    images = torch.randn(1, 3, args.height, args.width, device=device)
    mask = torch.zeros(1, args.height, args.width, dtype=torch.bool, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
    times, cpu_times = [], []
    with torch.inference_mode(), autocast:
        for run in range(args.runs + 1):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, cpu_start = time.perf_counter(), time.process_time()
            model(images, mask)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if run:  # the first forward warms up allocators and kernels
                times.append(time.perf_counter() - start)
                cpu_times.append(time.process_time() - cpu_start)
    best = min(times)
    result = {
        "model": f"DINO-{args.scales}scale R50",
        "input": f"1x3x{args.height}x{args.width}",
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "backend": deformable_attention_backend(device),
        "images_per_s": round(1 / best, 4),
        "seconds_per_image_best": round(best, 3),
        "seconds_per_image_mean": round(sum(times) / len(times), 3),
        # CPU seconds of all threads: stable when other processes share the cores, unlike wall time.
        "cpu_seconds_per_image": round(min(cpu_times), 3),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "torch": torch.__version__,
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
    }
    if device.type == "cuda":
        result["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        result["gpu"] = torch.cuda.get_device_name()
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
