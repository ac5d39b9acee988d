"""`make bench`'s run of gpu_bench.py: its small CPU shape, the fused kernel checked in Triton's interpreter.

    python apps/bench/bench_gpu.py [--out artifacts/gpu-bench-cpu.json]

On a GPU, `make gpu-bench` runs the full benchmark; this keeps the script exercised where there is none. The
interpreter is switched on here, before anything imports Triton (it is read when Triton decorates its functions).
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

from gpu_bench import main  # noqa: E402  (after TRITON_INTERPRET)

if __name__ == "__main__":
    sys.exit(main(["--device", "cpu", "--out", "artifacts/gpu-bench-cpu.json", *sys.argv[1:]]))
