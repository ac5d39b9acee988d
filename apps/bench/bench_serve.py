"""Inference API throughput and latency with micro-batching on and off, driven by a real load generator.

1. **The model alone**: the served model's forward at batch 1, 2, 4 and 8 on one image size (images/s per batch
   size, and the arithmetic rate it reaches): what batching can earn before any HTTP is involved.
2. **The running server**: `dinops serve` (gunicorn, one worker) on 127.0.0.1 once per max batch size, loaded with
   `hey` (github.com/rakyll/hey; Debian package `hey`) posting one JPEG per request at each concurrency; the
   servers alternate round after round so that a change in the machine's load hits all alike; medians are printed
   with images/s relative to batching off at the same concurrency, p50/p99 latency, failed requests and the
   worker's resident memory after each round.

    python apps/bench/bench_serve.py [--concurrency 1,16] [--requests 96] [--repeats 3] [--batch-sizes 1,4,8]

A benchmark, not a test: figures depend on the machine (and on whatever else it runs). The default model is the
small test model with random weights (dinops.serve.testing), images 640x480 served at 480 px as in the issue's
measurement; ``--checkpoint`` serves any other.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from dinops.serve.testing import free_port, running, write_small_checkpoint


def _jpeg(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((width, height), 40).convert("RGB").save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def model_alone(checkpoint: Path, size: int, max_size: int, image: bytes, batches: list[int], threads: int) -> None:
    """images/s of the detector's forward (preprocessing included, as the batcher runs it) per batch size."""
    from dinops.serve.app import settings_config
    from dinops.serve.detector import load_detector

    torch.set_num_threads(threads)
    env = {"DINO_CHECKPOINT": str(checkpoint), "DINO_MIN_SIZE": str(size), "DINO_MAX_SIZE": str(max_size)}
    detector = load_detector(settings_config(env | {"DINO_DEVICE": "cpu"}))
    decoded = Image.open(io.BytesIO(image)).convert("RGB")
    pixels = detector.prepare(decoded)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        detector.forward([pixels], [(decoded.height, decoded.width)])
    gflop = counter.get_total_flops() / 1e9
    size = f"{decoded.width}x{decoded.height}"
    print(
        f"model alone ({detector.info['inference_path']} path, {threads} threads), {size}, {gflop:.1f} GFLOP per image"
    )
    print(f"this machine's float32 matrix product: {matmul_gflops(threads):.0f} GFLOP/s (2048x2048x2048)")
    print(f"{'batch':>7} {'images/s':>9} {'ms/image':>9} {'vs batch 1':>11} {'GFLOP/s':>8}")
    first = None
    for batch in batches:
        detector.forward([pixels] * batch, [(decoded.height, decoded.width)] * batch)  # warm-up
        times = []
        for _ in range(3):
            start = time.perf_counter()
            detector.forward([pixels] * batch, [(decoded.height, decoded.width)] * batch)
            times.append((time.perf_counter() - start) / batch)
        per_image = min(times)
        first = first or per_image
        rate = f"{1 / per_image:>9.2f} {per_image * 1000:>9.1f} {first / per_image:>10.2f}x {gflop / per_image:>8.1f}"
        print(f"{batch:>7} {rate}", flush=True)


def matmul_gflops(threads: int) -> float:
    """The arithmetic rate of a large float32 matrix product here: what the model could reach at best."""
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    start = time.perf_counter()
    for _ in range(3):
        a @ b
    return 3 * 2 * 2048**3 / (time.perf_counter() - start) / 1e9


def worker_rss_mib(master_pid: int) -> float:
    """Resident memory of the gunicorn master's children (the worker), from /proc."""
    total = 0
    for task in Path(f"/proc/{master_pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                for line in Path(f"/proc/{child}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
    return total / 1024


def hey(url: str, body: Path, requests: int, concurrency: int) -> tuple[float, float, float, int]:
    """images/s, p50 and p99 ms and failed requests of ``requests`` POSTs of ``body`` at ``concurrency``."""
    command = ["hey", "-n", str(requests), "-c", str(concurrency), "-m", "POST", "-T", "image/jpeg"]
    command += ["-D", str(body), "-t", "300", "-o", "csv", url]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    if len(rows) != requests:
        raise SystemExit(f"hey reported {len(rows)} of {requests} requests:\n{done.stdout[-2000:]}{done.stderr}")
    latencies = sorted(float(r["response-time"]) for r in rows)
    elapsed = max(float(r["offset"]) + float(r["response-time"]) for r in rows)
    failed = sum(r["status-code"] != "200" for r in rows)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * len(latencies)) - 1)]
    return requests / elapsed, statistics.median(latencies) * 1000, p99 * 1000, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--requests", type=int, default=96, help="requests per round and concurrency")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds per setting; medians are printed")
    parser.add_argument("--batch-sizes", default="1,4,8", help="DINO_BATCH_MAX_SIZE of the servers (1: batching off)")
    parser.add_argument("--wait-ms", default="0", help="DINO_BATCH_MAX_WAIT_MS of the servers (default 0, as served)")
    parser.add_argument("--min-size", type=int, default=480)
    parser.add_argument("--max-size", type=int, default=640)
    parser.add_argument("--image", default="640x480", help="WxH of the posted JPEG")
    parser.add_argument("--checkpoint", help="serve this checkpoint instead of the small random-weight model")
    parser.add_argument("--torch-threads", type=int, default=0, help="DINO_TORCH_THREADS (0: the CPU limit)")
    parser.add_argument("--fast-path", default="true", help="DINO_FAST_PATH of the servers")
    args = parser.parse_args()
    if shutil.which("hey") is None:
        raise SystemExit("hey is not installed: apt-get install hey (make bench installs it)")
    width, height = map(int, args.image.split("x"))
    image = _jpeg(width, height)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        checkpoint = Path(args.checkpoint) if args.checkpoint else write_small_checkpoint(Path(tmp) / "small.pth")
        threads = args.torch_threads or torch.get_num_threads()
        model_alone(checkpoint, args.min_size, args.max_size, image, [1, 2, 4, 8], threads)
        body = Path(tmp) / "image.jpg"
        body.write_bytes(image)
        servers = {}
        for max_batch in batch_sizes:
            bind = f"127.0.0.1:{free_port()}"
            env = {"DINO_CHECKPOINT": str(checkpoint), "DINO_BIND": bind, "DINO_BATCH_MAX_SIZE": str(max_batch),
                   "DINO_CPU_BATCH_MAX_SIZE": str(max_batch),
                   "DINO_BATCH_MAX_WAIT_MS": args.wait_ms, "DINO_MIN_SIZE": str(args.min_size),
                   "DINO_MAX_SIZE": str(args.max_size), "DINO_THREADS": "32", "DINO_QUEUE_SIZE": "256",
                   "DINO_REQUEST_TIMEOUT_S": "600", "DINO_TORCH_THREADS": str(args.torch_threads),
                   "DINO_FAST_PATH": args.fast_path}  # fmt: skip
            process = stack.enter_context(running("serve", env, f"http://{bind}", Path(tmp) / f"serve-{max_batch}.log"))
            servers[max_batch] = (f"http://{bind}/v1/detect", process)
            hey(servers[max_batch][0], body, 4, 2)  # warm the worker's caches
        print(f"\nserver: {args.requests} requests per round, {args.repeats} alternating rounds, medians")
        columns = f"{'images/s':>9} {'vs off':>7} {'p50 ms':>8} {'p99 ms':>8} {'failed':>6}  worker RSS MiB per round"
        print(f"{'max batch':>9} {'clients':>7} {columns}")
        for concurrency in map(int, args.concurrency.split(",")):
            rounds: dict[int, list[tuple[float, float, float, int]]] = {b: [] for b in servers}
            rss: dict[int, list[float]] = {b: [] for b in servers}
            for _ in range(args.repeats):
                for max_batch, (url, process) in servers.items():
                    rounds[max_batch].append(hey(url, body, args.requests, concurrency))
                    rss[max_batch].append(worker_rss_mib(process.pid))
            base = statistics.median(r[0] for r in rounds[min(servers)])
            for max_batch, results in rounds.items():
                rate, p50, p99 = (statistics.median(column) for column in list(zip(*results, strict=True))[:3])
                failed = sum(r[3] for r in results)
                memory = " ".join(f"{m:.0f}" for m in rss[max_batch])
                print(
                    f"{max_batch:>9} {concurrency:>7} {rate:>9.2f} {rate / base:>6.2f}x {p50:>8.0f} {p99:>8.0f} "
                    f"{failed:>6}  {memory}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
