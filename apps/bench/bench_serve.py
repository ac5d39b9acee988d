"""Inference API throughput and latency: small DINO on CPU, concurrency 1/4/16, batching on and off.

Starts `dinops serve` (gunicorn, one worker) twice on 127.0.0.1 with a random-weight small checkpoint, sends
JPEG images from N client threads, and prints images/s and p50/p99 latency per setting. A benchmark, not a
test: figures depend on the machine (and on whatever else it runs).

    python apps/bench/bench_serve.py [--requests-per-client 4] [--repeats 3] [--torch-threads 0]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
from pathlib import Path

import bench_protocols  # beside this file: python puts the script's directory first on sys.path
from PIL import Image

from dinops.serve.testing import free_port, running, write_small_checkpoint


def _image(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((320, 240), 30 + seed).convert("RGB").save(buffer, "JPEG")
    return buffer.getvalue()


def measure(url: str, concurrency: int, per_client: int) -> tuple[float, float, float]:
    """images/s, p50 and p99 ms of POST /v1/detect with one JPEG per request (bench_protocols.measure)."""
    bodies = [{"data": _image(i), "headers": {"Content-Type": "image/jpeg"}} for i in range(8)]
    return bench_protocols.measure(url + "/v1/detect", bodies, 1, concurrency, per_client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds per setting; medians are printed")
    parser.add_argument("--min-size", default="128")
    parser.add_argument("--max-size", default="213")
    parser.add_argument("--torch-threads", default="0", help="DINO_TORCH_THREADS of the servers (0: torch's default)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        checkpoint = write_small_checkpoint(Path(tmp) / "small.pth")
        urls = {}
        for label, max_batch in (("off", "1"), ("on", "16")):
            bind = f"127.0.0.1:{free_port()}"
            env = {"DINO_CHECKPOINT": str(checkpoint), "DINO_BIND": bind, "DINO_BATCH_MAX_SIZE": max_batch,
                   "DINO_BATCH_MAX_WAIT_MS": "5", "DINO_MIN_SIZE": args.min_size, "DINO_MAX_SIZE": args.max_size,
                   "DINO_THREADS": "32", "DINO_QUEUE_SIZE": "256", "DINO_REQUEST_TIMEOUT_S": "600",
                   "DINO_TORCH_THREADS": args.torch_threads}  # fmt: skip
            stack.enter_context(running("serve", env, f"http://{bind}", Path(tmp) / f"serve-{label}.log"))
            urls[label] = f"http://{bind}"
            measure(urls[label], 1, 2)  # warm the worker's caches
        print(f"{'batching':>9} {'clients':>7} {'images/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        for concurrency in map(int, args.concurrency.split(",")):
            rounds: dict[str, list[tuple[float, float, float]]] = {label: [] for label in urls}
            for _ in range(args.repeats):  # alternate, so that a change in the machine's load hits both alike
                for label, url in urls.items():
                    rounds[label].append(measure(url, concurrency, args.requests_per_client))
            for label, results in rounds.items():
                rate, p50, p99 = (statistics.median(column) for column in zip(*results, strict=True))
                print(f"{label:>9} {concurrency:>7} {rate:>9.2f} {p50:>8.0f} {p99:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
