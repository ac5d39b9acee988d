"""The inference protocols side by side: /v1/detect, Open Inference Protocol V2 with base64 JSON and with binary data.

Starts `dinops serve` (gunicorn, one worker, batching on) once on 127.0.0.1 with a random-weight small checkpoint,
then sends the same JPEG images through each protocol from N client threads, one image per request (and V2 binary
with 4 images per request), alternating the protocols round by round so that a change in the machine's load hits
all alike. Prints images/s, p50/p99 request latency and each protocol's throughput relative to /v1/detect at the
same concurrency. Request bodies are built before the clock starts: the figures are the server's and the wire's.
A benchmark, not a test: figures depend on the machine (and on whatever else it runs).

    python apps/bench/bench_protocols.py [--concurrency 1,8] [--requests-per-client 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from PIL import Image

from dinops.serve.testing import free_port, running, write_small_checkpoint

HEADER = "Inference-Header-Content-Length"  # the binary tensor data extension's header


def _image(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((320, 240), 30 + seed).convert("RGB").save(buffer, "JPEG")
    return buffer.getvalue()


def _v2_json(images: list[bytes]) -> dict:
    data = [base64.b64encode(image).decode() for image in images]
    body = {"inputs": [{"name": "image", "shape": [len(images)], "datatype": "BYTES", "data": data}]}
    return {"data": json.dumps(body).encode(), "headers": {"Content-Type": "application/json"}}


def _v2_binary(images: list[bytes]) -> dict:
    tensor = b"".join(struct.pack("<I", len(image)) + image for image in images)  # 4-byte LE length, then bytes
    parameters = {"binary_data_size": len(tensor)}
    head = {"inputs": [{"name": "image", "shape": [len(images)], "datatype": "BYTES", "parameters": parameters}]}
    head["parameters"] = {"binary_data_output": True}
    text = json.dumps(head).encode()
    return {"data": text + tensor, "headers": {HEADER: str(len(text)), "Content-Type": "application/octet-stream"}}


def requests_of(url: str, images: list[bytes]) -> dict[str, tuple[str, list[dict], int]]:
    """protocol -> (URL, request bodies, images per request)."""
    infer = url + "/v2/models/dino/infer"
    raw = [{"data": image, "headers": {"Content-Type": "image/jpeg"}} for image in images]
    groups = [images[i : i + 4] for i in range(0, len(images), 4)]
    return {
        "/v1/detect (image body)": (url + "/v1/detect", raw, 1),
        "v2 infer, JSON base64": (infer, [_v2_json([image]) for image in images], 1),
        "v2 infer, binary": (infer, [_v2_binary([image]) for image in images], 1),
        "v2 infer, binary, 4 per request": (infer, [_v2_binary(group) for group in groups], 4),
    }


def measure(url: str, bodies: list[dict], per_request: int, concurrency: int, per_client: int):
    def client(index: int) -> list[float]:
        latencies = []
        with requests.Session() as session:
            for k in range(per_client):
                started = time.perf_counter()
                response = session.post(url, timeout=600, **bodies[(index + k) % len(bodies)])
                if response.status_code != 200:
                    raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
                latencies.append(time.perf_counter() - started)
        return latencies

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = sorted(t for batch in pool.map(client, range(concurrency)) for t in batch)
    elapsed = time.perf_counter() - started
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    return len(latencies) * per_request / elapsed, statistics.median(latencies) * 1000, p99 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8", help="client threads, comma-separated")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds per setting; medians are printed")
    parser.add_argument("--min-size", default="128")
    parser.add_argument("--max-size", default="213")
    args = parser.parse_args()
    images = [_image(i) for i in range(8)]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_small_checkpoint(Path(tmp) / "small.pth")
        bind = f"127.0.0.1:{free_port()}"
        env = {"DINO_CHECKPOINT": str(checkpoint), "DINO_BIND": bind, "DINO_BATCH_MAX_SIZE": "16",
               "DINO_BATCH_MAX_WAIT_MS": "5", "DINO_MIN_SIZE": args.min_size, "DINO_MAX_SIZE": args.max_size,
               "DINO_THREADS": "32", "DINO_QUEUE_SIZE": "256", "DINO_REQUEST_TIMEOUT_S": "600"}  # fmt: skip
        with running("serve", env, f"http://{bind}", Path(tmp) / "serve.log"):
            protocols = requests_of(f"http://{bind}", images)
            for url, bodies, per_request in protocols.values():
                measure(url, bodies, per_request, 1, 1)  # warm the worker's caches, check every protocol answers
            print(f"{'protocol':<33} {'clients':>7} {'images/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'vs /v1/detect':>13}")
            for concurrency in map(int, args.concurrency.split(",")):
                rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in protocols}
                for _ in range(args.repeats):
                    for name, (url, bodies, per_request) in protocols.items():
                        rounds[name].append(measure(url, bodies, per_request, concurrency, args.requests_per_client))
                medians = {
                    name: tuple(statistics.median(column) for column in zip(*results, strict=True))
                    for name, results in rounds.items()
                }
                baseline = medians["/v1/detect (image body)"][0]
                for name, (rate, p50, p99) in medians.items():
                    ratio = rate / baseline
                    print(
                        f"{name:<33} {concurrency:>7} {rate:>9.2f} {p50:>8.0f} {p99:>8.0f} {ratio:>12.2f}x", flush=True
                    )


if __name__ == "__main__":
    main()
