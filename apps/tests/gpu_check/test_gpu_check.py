"""`dinops gpu-check` on this CPU-only machine, and the pieces of its GPU path that are plain arithmetic."""

from __future__ import annotations

import json

import pytest
import torch

from dinops import gpu_check

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the CPU-only answer")


@needs_no_gpu
def test_json_reports_no_gpu_with_exit_status_1(capsys):
    assert gpu_check.main(["--json"]) == gpu_check.EXIT_FAILED == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False
    assert report["devices"] == []
    assert report["torch_version"] == torch.__version__
    assert [(c["name"], c["status"]) for c in report["checks"]] == [("gpu visible", "fail")]
    assert report["checks"][0]["detail"].startswith("no GPU: ")


@needs_no_gpu
def test_human_output_names_the_failed_check(capsys):
    assert gpu_check.main([]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"torch {torch.__version__}, CUDA ")
    assert lines[-1].startswith("FAIL  gpu visible: no GPU: ")


@pytest.mark.parametrize("argv", [["--size", "8"], ["--size", "many"], ["--frobnicate"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(argv)
    assert exc.value.code == gpu_check.EXIT_ERROR == 2
    assert "dinops gpu-check" in capsys.readouterr().err


def test_matmul_on_cpu_matches_the_float64_reference():
    error, seconds = gpu_check.matmul_check(torch, "cpu", 64)
    assert 0.0 <= error < 1e-5
    assert seconds > 0


def test_relative_error_catches_a_wrong_element():
    reference = torch.arange(1.0, 17.0).reshape(4, 4)
    wrong = reference.clone()
    wrong[2, 3] += 0.16  # 1 % of the largest magnitude (16)
    assert gpu_check.relative_error(reference, reference) == 0.0
    assert gpu_check.relative_error(wrong, reference) == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("capability", "arch_list", "ok", "how"),
    [
        ((9, 0), ["sm_80", "sm_90"], True, "native kernels for sm_90"),
        ((8, 6), ["sm_80", "sm_90"], True, "native kernels for sm_86"),
        ((12, 0), ["sm_90", "compute_90"], True, "PTX JIT for sm_120"),
        ((12, 0), ["sm_80", "sm_90"], False, "no kernels for sm_120"),
        ((7, 0), ["sm_80", "compute_80"], False, "no kernels for sm_70"),
    ],
)
def test_arch_supported(capability, arch_list, ok, how):
    supported, detail = gpu_check.arch_supported(capability, arch_list)
    assert supported is ok
    assert how in detail
