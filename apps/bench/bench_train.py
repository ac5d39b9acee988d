"""Training throughput and peak memory of the full DINO-4scale R50 (batch 2), against the original figure.

The original set-up trained at 4.9 images/s with 12.2 GB peak GPU memory on one RTX 3090 (batch 2, fp32).
This measures full training steps (forward with denoising queries, criterion, backward, clip, AdamW step)
on random COCO-sized images with a few boxes each; the backbone is randomly initialised, which costs the
same as a pretrained one. On CPU it runs a few iterations at a reduced size (a COCO-size step takes minutes
there); on a GPU, COCO size (800x1066) in fp32 or bf16.

    python apps/bench/bench_train.py                       # CPU: 2 timed iterations at 512x683
    python apps/bench/bench_train.py --device cuda --amp bf16 --iters 20
    python apps/bench/bench_train.py --json                # one JSON object
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import resource
import sys
import time

import torch

from dinops.model import DINOConfig, build_criterion, build_dino, pad_images

ORIGINAL = {"device": "RTX 3090", "images_per_s": 4.9, "peak_memory_gb": 12.2, "batch_size": 2, "amp": "none"}
log = logging.getLogger("bench_train")


def random_batch(batch: int, height: int, width: int, num_classes: int, gen: torch.Generator):
    images = [torch.randn(3, height, width, generator=gen) for _ in range(batch)]
    targets = []
    for _ in range(batch):
        n = 7  # COCO's average objects per image
        centre = torch.rand(n, 2, generator=gen) * 0.6 + 0.2
        size = torch.rand(n, 2, generator=gen) * 0.3 + 0.05
        targets.append(
            {"boxes": torch.cat([centre, size], 1), "labels": torch.randint(1, num_classes, (n,), generator=gen)}
        )
    return images, targets


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cfg = DINOConfig.dino_4scale_r50()
    model = build_dino(cfg).to(device).train()
    criterion = build_criterion(cfg).to(device)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [
        {"params": [p for n, p in trainable if "backbone." not in n]},
        {"params": [p for n, p in trainable if "backbone." in n], "lr": cfg.lr_backbone},
    ]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(0)
    images, targets = random_batch(args.batch_size, args.height, args.width, cfg.num_classes, gen)
    padded, mask = pad_images(images)
    padded, mask = padded.to(device), mask.to(device)
    targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
    amp = contextlib.nullcontext() if args.amp == "none" else torch.autocast(device.type, dtype=torch.bfloat16)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.warmup + args.iters):
        began = time.perf_counter()
        with amp:
            outputs = model(padded, mask, targets=targets)
            losses = criterion(outputs, targets)
        loss = sum(losses[k] * criterion.weight_dict[k] for k in losses if k in criterion.weight_dict)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - began
        log.info(
            "iteration %d: %.2f s, loss %.3f%s",
            i,
            elapsed,
            float(loss.detach()),
            " (warm-up)" if i < args.warmup else "",
        )
        if i >= args.warmup:
            times.append(elapsed)
    if device.type == "cuda":
        peak_gb = torch.cuda.max_memory_allocated() / 1e9
        memory_kind = "GPU memory allocated by PyTorch"
    else:
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
        memory_kind = "process peak resident memory"
    seconds = sum(times) / len(times)
    return {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({torch.get_num_threads()} threads)",
        "model": "DINO-4scale R50",
        "batch_size": args.batch_size,
        "image_size": [args.height, args.width],
        "amp": args.amp,
        "iterations": args.iters,
        "seconds_per_iteration": round(seconds, 3),
        "images_per_s": round(args.batch_size / seconds, 3),
        "peak_memory_gb": round(peak_gb, 2),
        "memory_kind": memory_kind,
        "original": ORIGINAL,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    p.add_argument("--amp", default="none", choices=("none", "bf16"))
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--height", type=int, help="image height (default 800 on GPU, 512 on CPU)")
    p.add_argument("--width", type=int, help="image width (default 1066 on GPU, 683 on CPU)")
    p.add_argument("--iters", type=int, help="timed iterations (default 20 on GPU, 2 on CPU)")
    p.add_argument("--warmup", type=int, help="untimed iterations first (default 3 on GPU, 1 on CPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args(argv)
    gpu = args.device == "cuda"
    for name, on_gpu, on_cpu in (("height", 800, 512), ("width", 1066, 683), ("iters", 20, 2), ("warmup", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    result = run(args)
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        o = result["original"]
        sys.stdout.write(
            f"{'':28}{'images/s':>10}{'peak GB':>10}\n"
            f"{'this: ' + result['device']:28}{result['images_per_s']:>10.2f}{result['peak_memory_gb']:>10.2f}"
            f"   ({result['amp']}, batch {result['batch_size']}, {args.height}x{args.width}, {result['memory_kind']})\n"
            f"{'original: ' + o['device']:28}{o['images_per_s']:>10.2f}{o['peak_memory_gb']:>10.2f}   (fp32, batch 2)\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
