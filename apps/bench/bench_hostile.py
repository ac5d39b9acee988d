"""A hostile load against one inference worker: decompression-heavy images mixed with normal ones, all at once.

Starts `dinops serve` (gunicorn, one worker, the default limits: DINO_MAX_IMAGE_PIXELS, DINO_MAX_IMAGE_MB,
DINO_MAX_DECODED_MB, DINO_MAX_IMAGES_PER_REQUEST, DINO_DECODE_THREADS, 32 request threads) on 127.0.0.1 with a
random-weight small checkpoint at the model's real sizes (800/1333), then sends from N client threads a shuffled mix
of requests for a fixed number of rounds:

- normal: a 640x480 JPEG photo-like image to /v1/detect;
- heavy but allowed: a 16-bit 5000x5000 PNG of zeros (~50 kB) and an 8-bit RGB 5000x5000 PNG (~80 kB), alone to
  /v1/detect and four at a time in KServe V1 and Open Inference Protocol V2 requests;
- refused: 16-bit 6000x6000 (pixels), a 5000x5000 palette PNG with transparency and a 4000x4000 RGBA WebP (memory),
  a PNG header claiming 30000x30000 (bomb), 17 images in one request (count).

A watchdog samples the worker's resident memory and kills it, as the container's memory limit would, if it grows
past --limit-mb over its idle size. Prints the worker's peak memory (the kernel's VmHWM, over the idle baseline and
in all), the requests served, the 4xx answers by code, the 5xx answers and dropped connections (both must be 0), and
fails unless the same worker is alive at the end. A benchmark, not a test: the figures depend on the machine.

    python apps/bench/bench_hostile.py [--clients 16] [--rounds 1] [--limit-mb 1024]
"""

from __future__ import annotations

import argparse
import collections
import io
import random
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests
from PIL import Image

from dinops.serve.testing import (
    WorkerMemory,
    children,
    free_port,
    kserve_v1_body,
    noise_jpeg,
    oip_v2_binary_body,
    running,
    write_small_checkpoint,
)

MIB = 2**20


def _encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _header_bomb(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose IHDR claims ``width`` x ``height``."""
    import zlib

    data = bytearray(_encoded(Image.new("L", (1, 1)), "PNG"))
    ihdr = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


def load() -> list[tuple[str, str, dict]]:
    """(kind, path, requests.post keyword arguments) of one round."""
    png = {"Content-Type": "image/png"}
    deep = _encoded(Image.fromarray(np.zeros((5000, 5000), dtype=np.uint16)), "PNG")
    wide = _encoded(Image.new("RGB", (5000, 5000)), "PNG")
    refused = {
        "refused: 16-bit 6000x6000": _encoded(Image.fromarray(np.zeros((6000, 6000), dtype=np.uint16)), "PNG"),
        "refused: palette 5000x5000": _encoded(Image.new("P", (5000, 5000)), "PNG", transparency=0),
        "refused: RGBA WebP 4000x4000": _encoded(Image.new("RGBA", (4000, 4000)), "WEBP", lossless=True),
        "refused: 30000x30000 header": _header_bomb(30000, 30000),
    }
    normal = [noise_jpeg(seed, (640, 480)) for seed in range(4)]
    items = [("normal", "/v1/detect", {"data": image, "headers": {"Content-Type": "image/jpeg"}}) for image in normal]
    items += [
        ("heavy: 16-bit 5000x5000", "/v1/detect", {"data": deep, "headers": png}),
        ("heavy: RGB 5000x5000", "/v1/detect", {"data": wide, "headers": png}),
        ("heavy: KServe V1, 4 x 16-bit", "/v1/models/dino:predict", kserve_v1_body([deep] * 4)),
        ("heavy: OIP V2, 4 x RGB", "/v2/models/dino/infer", oip_v2_binary_body([wide] * 4)),
        ("refused: 17 images", "/v1/models/dino:predict", kserve_v1_body([normal[0]] * 17)),
    ]
    items += [(kind, "/v1/detect", {"data": body, "headers": png}) for kind, body in refused.items()]
    return items


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="client threads sending at once")
    parser.add_argument("--rounds", type=int, default=1, help="times each request of the mix is sent")
    parser.add_argument("--limit-mb", type=float, default=1024, help="growth over idle at which the worker is killed")
    args = parser.parse_args()
    items = load() * args.rounds
    random.Random(0).shuffle(items)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_small_checkpoint(Path(tmp) / "small.pth")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {"DINO_CHECKPOINT": str(checkpoint), "DINO_BIND": f"127.0.0.1:{port}", "DINO_REQUEST_TIMEOUT_S": "300"}
        with running("serve", env, url, Path(tmp) / "serve.log") as master:
            (worker,) = children(master.pid)
            warm = items[0][2] if items[0][0] == "normal" else load()[0][2]
            assert requests.post(url + "/v1/detect", timeout=300, **warm).status_code == 200
            memory = WorkerMemory(worker, kill_above=int(args.limit_mb * MIB)).start()
            idle = memory.baseline

            def send(item: tuple[str, str, dict]) -> tuple[str, int | str, str]:
                kind, path, kwargs = item
                try:
                    response = requests.post(url + path, timeout=600, **kwargs)
                except requests.RequestException as exc:
                    return kind, "dropped", type(exc).__name__
                code = response.json().get("code", "") if response.status_code != 200 else ""
                return kind, response.status_code, code

            started = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                answers = list(pool.map(send, items))
            elapsed = time.perf_counter() - started
            grown = memory.stop()
            alive = children(master.pid) == [worker]
    by_status = collections.Counter(status for _, status, _ in answers)
    refusals = collections.Counter(f"{status} {code}" for _, status, code in answers if status != 200)
    served = sum(1 for _, status, _ in answers if status == 200)
    server_errors = sum(1 for _, status, _ in answers if isinstance(status, int) and status >= 500)
    dropped = by_status.get("dropped", 0)
    print(f"requests: {len(answers)} from {args.clients} clients in {elapsed:.1f} s; served (200): {served}")
    for reason, count in sorted(refusals.items()):
        print(f"  {reason}: {count}")
    print(f"5xx: {server_errors}; dropped connections: {dropped}; same worker alive: {alive}")
    print(
        f"worker memory: idle {idle / MIB:.0f} MiB, peak {(idle + grown) / MIB:.0f} MiB "
        f"(+{grown / MIB:.0f} MiB; limit +{args.limit_mb:.0f} MiB)"
    )
    for kind in sorted({kind for kind, _, _ in answers}):
        statuses = collections.Counter(str(status) for k, status, _ in answers if k == kind)
        print(f"  {kind:<32} {dict(statuses)}")
    ok = memory.killed_at is None and alive and server_errors == 0 and dropped == 0 and grown <= args.limit_mb * MIB
    if not ok:
        print("FAILED: the worker must stay alive, within the limit, with no 5xx and no dropped connection")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
