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
        "copy",
        "inference",
        "official",
        "kernel_sweep",
    }
    check = report["fused_check"]
    assert check["passed"] is True
    for dtype, tolerance in (("float32", 1e-4), ("float16", 5e-3), ("bfloat16", 2e-2)):
        assert set(check[dtype]) == {"output", "value", "locations", "weights"}
        assert all(0 <= error <= tolerance for error in check[dtype].values()), check[dtype]
    assert max(check["float32"].values()) < 1e-5  # float32 sums: a broken tap would be off by order 1
    for section in ("kernel", "train", "copy", "inference", "official", "kernel_sweep"):
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
    assert not {"kernel", "train", "copy", "inference", "official", "kernel_sweep"} & set(report)
    assert "fused vs pure: FAILED" in capsys.readouterr().out


def test_a_fused_kernel_that_fails_to_run_stops_the_benchmark_with_the_error(tmp_path, monkeypatch, capsys):
    """A kernel that does not compile or launch on the machine (raises) counts as a failed check: exit 1, the error
    in the JSON and the table, no timing section."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import gpu_bench

    def broken(value, shapes, locations, weights):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setitem(gpu_bench.BACKENDS, "triton", broken)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "gpu-bench.json"
    assert gpu_bench.main(["--device", "cpu", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["fused_check"] == {"passed": False, "error": "RuntimeError('PassManager::run failed')"}
    assert not {"kernel", "train", "copy", "inference", "official", "kernel_sweep"} & set(report)
    table = capsys.readouterr().out
    assert "fused vs pure: FAILED" in table and "PassManager::run failed" in table


def test_each_training_variant_gets_its_ratio_to_the_official_step(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))
    from official_ops import official_ratios

    ours = {"batch": 2, "fp32_fused": {"images_per_s": 6.91}, "tf32_fused": {"images_per_s": 9.27}}
    ours["bf16_pure"] = {"skipped": "time budget"}
    assert official_ratios({"images_per_s": 7.53, "peak_gib": 6.17}, ours) == {
        "ratio_fp32_fused": 0.918,
        "ratio_tf32_fused": 1.231,
    }
    assert official_ratios({"skipped": "nvcc not found"}, ours) == {}


def test_the_official_sources_are_respelled_for_current_pytorch_only_where_they_must(tmp_path, monkeypatch):
    """The official op's two calls that current PyTorch refuses (DeprecatedTypeProperties into the dispatch macro;
    `.type().is_cuda()`) are respelled in a copy; the checkout is untouched, nothing else changes."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import official_ops

    src = tmp_path / "DINO" / "models" / "dino" / "ops" / "src"
    (src / "cuda").mkdir(parents=True)
    cuda = (
        'AT_ASSERTM(value.type().is_cuda(), "value must be a CUDA tensor");\n'
        'AT_DISPATCH_FLOATING_TYPES(value.type(), "ms_deform_attn_forward_cuda", ([&] {\n'
        "    value.data<scalar_t>();\n"
    )
    (src / "cuda" / "ms_deform_attn_cuda.cu").write_text(cuda)
    (src / "vision.cpp").write_text("#include <ms_deform_attn.h>\n")
    copy = official_ops.ported_sources(tmp_path / "DINO", tmp_path / "build")
    assert (copy / "cuda" / "ms_deform_attn_cuda.cu").read_text() == (
        'AT_ASSERTM(value.is_cuda(), "value must be a CUDA tensor");\n'
        'AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "ms_deform_attn_forward_cuda", ([&] {\n'
        "    value.data<scalar_t>();\n"
    )
    assert (copy / "vision.cpp").read_text() == "#include <ms_deform_attn.h>\n"
    assert (src / "cuda" / "ms_deform_attn_cuda.cu").read_text() == cuda
