"""Downloader throughput against a local server that caps each connection's bandwidth.

Serves one file from 127.0.0.1 with a per-connection cap (as a remote CDN or a congested link would), then
downloads it with 1 connection (a plain single-stream download) and with several Range connections, and
prints MiB/s for each. A benchmark, not a test.

    python apps/bench/bench_download.py [--size-mb 64] [--cap-mb 4] [--connections 1,2,4,8]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

from dinops.download.http import Fetcher, Policy
from dinops.download.testserver import Faults, FileServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--cap-mb", type=float, default=4.0, help="bandwidth cap per connection, MiB/s")
    parser.add_argument("--connections", default="1,2,4,8")
    parser.add_argument("--piece-mb", type=float, default=4.0)
    args = parser.parse_args()
    data = os.urandom(args.size_mb << 20)
    digest = {"sha256": hashlib.sha256(data).hexdigest()}
    server = FileServer()
    server.files["/big.bin"] = data
    server.faults["/big.bin"] = Faults(bytes_per_s=args.cap_mb * 2**20)
    print(f"file {args.size_mb} MiB, cap {args.cap_mb:g} MiB/s per connection")
    print(f"{'connections':>11} {'seconds':>8} {'MiB/s':>7}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for connections in map(int, args.connections.split(",")):
                target = Path(tmp) / f"big-{connections}.bin"
                fetcher = Fetcher(Policy(connections=connections, piece_size=int(args.piece_mb * 2**20), retries=3))
                started = time.perf_counter()
                fetcher.fetch(server.url + "/big.bin", target, digest)
                elapsed = time.perf_counter() - started
                print(f"{connections:>11} {elapsed:>8.2f} {args.size_mb / elapsed:>7.2f}", flush=True)
                target.unlink()
    finally:
        server.close()


if __name__ == "__main__":
    main()
