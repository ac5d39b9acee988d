"""dinops-gpu-check on this CPU-only machine: it must say "no GPU" and exit 1, never pass."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]


def test_reports_no_gpu_with_exit_status_1(images, docker):
    result = docker(
        "run", "--rm", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        images["gpu-check"], "--json",
        check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is False
    assert report["torch_version"].startswith("2.14.1")
    assert report["cuda_version"]  # the CUDA build of PyTorch, which also runs on CPU
    assert report["devices"] == []
    assert [(c["name"], c["status"]) for c in report["checks"]] == [("gpu visible", "fail")]
    assert report["checks"][0]["detail"] == "no GPU: PyTorch sees no CUDA device"


def test_human_output_and_usage_error(images, docker):
    human = docker("run", "--rm", images["gpu-check"], check=False)
    assert human.returncode == 1
    assert human.stdout.splitlines()[-1] == "FAIL  gpu visible: no GPU: PyTorch sees no CUDA device"
    usage = docker("run", "--rm", images["gpu-check"], "--size", "1", check=False)
    assert usage.returncode == 2
    assert "--size must be between 16 and 16384" in usage.stderr
