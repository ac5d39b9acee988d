"""The validator playbook against this machine (connection local, no GPU): skips are skips, the exit status and
the JSON verdict agree, and a failing check fails the run."""

from __future__ import annotations

import json
import subprocess

import pytest
from ansible.errors import AnsibleFilterError

from dinops_testing import REPO, load_plugin

report = load_plugin("roles/validate/filter_plugins/validate_report.py")
GPU_CHECKS = ["driver_loaded", "driver_runs_images", "nvidia_smi", "cuda_in_image"]


def run_verify(env, tmp_path, extra_env=None):
    path = tmp_path / "verify.json"
    run_env = dict(env, **(extra_env or {}))
    proc = subprocess.run(
        ["ansible-playbook", "playbooks/verify.yml", "-e", f"validate_report_path={path}"],
        cwd=REPO,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, json.loads(path.read_text())


def docker_answers(env) -> bool:
    return subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="module")
def verify_run(ansible_env, tmp_path_factory):
    return run_verify(ansible_env, tmp_path_factory.mktemp("verify"))


def gpu_host_checks(verdict):
    return {r["check"]: r for r in verdict["hosts"]["localhost"] if r["section"] == "gpu_host"}


def test_gpu_checks_are_skipped_not_passed_on_a_host_without_gpu(verify_run):
    proc, verdict = verify_run
    checks = gpu_host_checks(verdict)
    assert list(checks) == [
        "driver_loaded",
        "driver_runs_images",
        "nvidia_smi",
        "docker_default_runtime",
        "cuda_in_image",
    ]
    for name in GPU_CHECKS:
        assert checks[name]["status"] == "skip"
        assert checks[name]["detail"] == "no NVIDIA GPU on the PCI bus"
        assert f"SKIP gpu_host/{name}: no NVIDIA GPU on the PCI bus" in proc.stdout


def test_exit_status_and_verdict_agree_with_the_machine(verify_run, ansible_env):
    proc, verdict = verify_run
    runtime = gpu_host_checks(verdict)["docker_default_runtime"]
    if docker_answers(ansible_env):
        assert runtime == {
            "section": "gpu_host",
            "check": "docker_default_runtime",
            "status": "pass",
            "detail": "default runtime runc (no GPU: nvidia must not be the default)",
        }
    else:
        assert runtime["status"] == "fail"
    statuses = [r["status"] for results in verdict["hosts"].values() for r in results]
    assert verdict["counts"] == {s: statuses.count(s) for s in ("pass", "fail", "skip")}
    assert verdict["passed"] is ("fail" not in statuses)
    assert (proc.returncode == 0) is verdict["passed"], proc.stdout[-3000:]


def test_an_unreachable_docker_daemon_fails_the_run(ansible_env, tmp_path):
    proc, verdict = run_verify(ansible_env, tmp_path, {"DOCKER_HOST": f"unix://{tmp_path}/no-such-docker.sock"})
    runtime = gpu_host_checks(verdict)["docker_default_runtime"]
    assert runtime["status"] == "fail"
    assert runtime["detail"].startswith("docker info failed: ")
    assert verdict["passed"] is False
    assert proc.returncode != 0
    assert "FAIL gpu_host/docker_default_runtime: docker info failed" in proc.stdout


def test_report_filter_counts_and_flags_hosts_without_results():
    ok = {"section": "s", "check": "a", "status": "pass", "detail": "fine"}
    skipped = {"section": "s", "check": "b", "status": "skip", "detail": "no GPU"}
    verdict = report.dinops_validate_report({"gpu1": [ok, skipped], "gpu2": []})
    assert verdict["counts"] == {"pass": 1, "fail": 1, "skip": 1}
    assert verdict["passed"] is False
    assert verdict["hosts"]["gpu2"] == [report.NOT_CHECKED]
    assert report.dinops_validate_line(skipped) == "SKIP s/b: no GPU"
    assert report.dinops_validate_report({"gpu1": [ok, skipped]})["passed"] is True


def test_report_filter_refuses_unknown_statuses():
    with pytest.raises(AnsibleFilterError, match="status pass, fail or skip"):
        report.dinops_validate_line({"section": "s", "check": "a", "status": "ok"})
