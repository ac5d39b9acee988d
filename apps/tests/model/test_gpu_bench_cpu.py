"""`make bench`'s run of the GPU benchmark at its CPU shape (apps/bench/bench_gpu.py): the fused kernel is checked
against the pure path in Triton's interpreter, the GPU timings are marked skipped, and the JSON has every section."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_gpu.py"


def test_cpu_run_checks_the_fused_kernel_and_writes_every_section(tmp_path):
    out = tmp_path / "gpu-bench.json"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DINO_OFFICIAL_SRC")}
    env["PYTHONPATH"] = str(BENCH.parents[1] / "src")
    result = subprocess.run(
        [sys.executable, str(BENCH), "--out", str(out)], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "fused vs pure: PASSED" in result.stdout
    report = json.loads(out.read_text())
    assert set(report) == {
        "device",
        "torch",
        "triton",
        "date",
        "command",
        "fused_check",
        "kernel",
        "train",
        "inference",
        "official",
    }
    check = report["fused_check"]
    assert check["passed"] is True
    for dtype, tolerance in (("float32", 1e-4), ("bfloat16", 2e-2)):
        assert set(check[dtype]) == {"output", "value", "locations", "weights"}
        assert all(0 <= error <= tolerance for error in check[dtype].values()), check[dtype]
    assert max(check["float32"].values()) < 1e-5  # float32 sums: a broken tap would be off by order 1
    for section in ("kernel", "train", "inference", "official"):
        assert report[section]["skipped"].startswith("no CUDA"), report[section]


def test_a_fused_kernel_that_differs_stops_the_benchmark_before_any_timing(tmp_path, monkeypatch, capsys):
    """A sampler with x and y swapped in the fused slot: the check fails, exit 1, the JSON says so and holds no
    timing section (in-process; TRITON_INTERPRET only tells the script that the CPU check may run)."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import gpu_bench

    from dinops.model.ms_deform_attn_core import ms_deform_attn_grid_sample

    def swapped(value, shapes, locations, weights):
        return ms_deform_attn_grid_sample(value.float(), shapes, locations.flip(-1), weights).to(value.dtype)

    monkeypatch.setitem(gpu_bench.BACKENDS, "triton", swapped)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "gpu-bench.json"
    assert gpu_bench.main(["--device", "cpu", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["fused_check"]["passed"] is False
    assert max(report["fused_check"]["float32"].values()) > 1e-2
    assert not {"kernel", "train", "inference", "official"} & set(report)
    assert "fused vs pure: FAILED" in capsys.readouterr().out
