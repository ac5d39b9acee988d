"""Training data loader from emulated network storage vs the local decoded-image cache, and `dinops cache` fill rates.

Writes a synthetic dataset (`dinops synth`, JPEGs of ``--size`` x ``--size`` pixels) to a temporary folder and
reads it through :class:`ThrottledCoco`, a CocoDetection whose image reads pay a latency per open (default 2 ms)
and share one link of a given bandwidth (default 100 MB/s, 10^6 bytes) among all readers, threads and loader
worker processes alike, as a shared NFS mount would. Page-cache effects are removed by the throttle: every read
pays the emulated cost, whatever the local disk does. Measured in one run:

- images/s of the training loader (CocoDetection + the training transforms + DataLoader with workers, batch 2),
  from the emulated network folder and from the filled local cache, and their ratio; the same without
  transforms (decoding and reading alone);
- the fill rate of `dinops cache` (:func:`dinops.data.cache.fill`) from the emulated network with 1 and N threads,
  and threads vs processes from the local folder (decode + write, CPU-bound).

    python apps/bench/bench_data.py [--images 300] [--size 640] [--mb-per-s 100] [--latency-ms 2] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dinops.data.cache import fill
from dinops.data.coco import CocoDetection
from dinops.data.loader import collate
from dinops.data.synth import SynthSpec, generate
from dinops.data.transforms import train_transforms
from dinops.train.settings import SETTINGS

DEFAULTS = {s.dest: s.default for s in SETTINGS}


class Link:
    """One shared link: a per-open latency, and a bandwidth that readers take turns on (inherited by forks)."""

    def __init__(self, bytes_per_s: float, latency_s: float) -> None:
        self.bytes_per_s, self.latency_s = bytes_per_s, latency_s
        self.free_at = multiprocessing.get_context("fork").Value("d", 0.0)  # when the link is next idle

    def read(self, path: Path) -> bytes:
        time.sleep(self.latency_s)  # the open's round trip; these overlap between readers
        data = path.read_bytes()
        with self.free_at.get_lock():
            start = max(time.monotonic(), self.free_at.value)
            self.free_at.value = start + len(data) / self.bytes_per_s
            done = self.free_at.value
        time.sleep(max(0.0, done - time.monotonic()))
        return data


class ThrottledCoco(CocoDetection):
    link: Link | None = None

    def decode_source(self, img: dict) -> np.ndarray:
        if self.link is None:
            return super().decode_source(img)
        with Image.open(io.BytesIO(self.link.read(self.image_dir / img["file_name"]))) as image:
            return np.array(image.convert("RGB"))


def loader_rate(dataset: CocoDetection, workers: int, batch: int) -> float:
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch, shuffle=False, num_workers=workers, collate_fn=collate, drop_last=False
    )
    began = time.perf_counter()
    count = sum(len(targets) for _, _, targets in loader)
    return count / (time.perf_counter() - began)


def fill_rate(data: Path, cache_dir: Path, workers: int, pool: str, link: Link | None) -> float:
    ds = split(data, cache_dir, None, link)
    with open(os.devnull, "w") as quiet:
        report = fill(ds, workers, pool, out=quiet)
    assert report.decoded == len(ds) and not report.failed, report
    return report.decoded / report.seconds


def split(data: Path, cache_dir: Path | None, transforms, link: Link | None) -> ThrottledCoco:
    ds = ThrottledCoco(
        data / "train2017", data / "annotations" / "instances_train2017.json", transforms, seed=0, cache_dir=cache_dir
    )
    ds.link = link
    return ds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--size", type=int, default=640, help="image side in pixels (square JPEGs)")
    parser.add_argument("--mb-per-s", type=float, default=100.0, help="emulated link bandwidth, MB/s (10^6 bytes)")
    parser.add_argument("--latency-ms", type=float, default=2.0, help="emulated latency per open")
    parser.add_argument("--loader-workers", type=int, default=2)
    parser.add_argument("--fill-workers", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    link = Link(args.mb_per_s * 1e6, args.latency_ms / 1e3)
    scales = [int(v) for v in DEFAULTS["train_scales"].split(",")]
    crops = [int(v) for v in DEFAULTS["crop_scales"].split(",")]
    crop_size = tuple(int(v) for v in DEFAULTS["crop_size"].split(","))
    transforms = train_transforms(scales, DEFAULTS["max_size"], crops, crop_size)
    result: dict[str, float | int | str] = {
        "images": args.images,
        "size": args.size,
        "mb_per_s": args.mb_per_s,
        "latency_ms": args.latency_ms,
        "cpus": os.cpu_count() or 1,
    }
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        data = generate(SynthSpec(train_images=args.images, val_images=1, image_size=args.size), Path(tmp) / "data")
        jpeg_bytes = sum(p.stat().st_size for p in (data / "train2017").iterdir())
        result["jpeg_kb"] = round(jpeg_bytes / args.images / 1e3, 1)
        result["synth_s"] = round(time.perf_counter() - began, 1)

        fill_1 = fill_rate(data, Path(tmp) / "c1", 1, "thread", link)
        fill_n = fill_rate(data, Path(tmp) / "cn", args.fill_workers, "thread", link)
        threads = fill_rate(data, Path(tmp) / "ct", 2, "thread", None)
        processes = fill_rate(data, Path(tmp) / "cp", 2, "process", None)
        result |= {
            "fill_network_1_thread": fill_1,
            f"fill_network_{args.fill_workers}_threads": fill_n,
            "fill_local_2_threads": threads,
            "fill_local_2_processes": processes,
        }
        cache_dir = Path(tmp) / "cn"  # filled above
        for name, tf in (("loader", transforms), ("reads", None)):
            network = loader_rate(split(data, None, tf, link), args.loader_workers, 2)
            local = loader_rate(split(data, cache_dir, tf, link), args.loader_workers, 2)
            result |= {f"{name}_network": network, f"{name}_cache": local, f"{name}_ratio": local / network}
    result["seconds"] = round(time.perf_counter() - began, 1)
    if args.json:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}))
        return
    print(
        f"{args.images} JPEGs {args.size}x{args.size} (~{result['jpeg_kb']} kB each); emulated network "
        f"{args.mb_per_s:g} MB/s shared, {args.latency_ms:g} ms per open; {result['cpus']} CPUs"
    )
    print(f"{'training loader (images/s)':<34} {'network':>8} {'cache':>8} {'ratio':>6}")
    for name, label in (("loader", f"transforms, {args.loader_workers} workers"), ("reads", "no transforms")):
        print(
            f"  {label:<32} {result[f'{name}_network']:>8.1f} {result[f'{name}_cache']:>8.1f} "
            f"{result[f'{name}_ratio']:>5.1f}x"
        )
    print("dinops cache fill (images/s)")
    print(f"  network, 1 thread                {fill_1:>8.1f}")
    print(f"  {f'network, {args.fill_workers} threads':<32} {fill_n:>8.1f}")
    print(f"  local, 2 threads                 {threads:>8.1f}")
    print(f"  local, 2 processes               {processes:>8.1f}")
    print(f"total {result['seconds']} s")


if __name__ == "__main__":
    main()
