"""scripts/verify.sh: the validator's exit contract (0 pass, 1 a check failed, 2 usage or environment error),
one human line per check, or one JSON object with --json. Runs against this machine (no GPU)."""

from __future__ import annotations

import json
import subprocess

from dinops_testing import REPO

SCRIPT = str(REPO / "scripts" / "verify.sh")


def verify(env, *args, extra_env=None):
    return subprocess.run(
        [SCRIPT, *args], cwd=REPO, env=dict(env, **(extra_env or {})), capture_output=True, text=True, timeout=300
    )


def test_json_verdict_and_exit_status_agree(ansible_env):
    proc = verify(ansible_env, "--json")
    verdict = json.loads(proc.stdout)
    assert set(verdict) >= {"counts", "hosts", "passed"}
    assert proc.returncode == (0 if verdict["passed"] else 1)
    statuses = {r["check"]: r["status"] for r in verdict["hosts"]["localhost"]}
    for check in ("driver_loaded", "driver_runs_images", "nvidia_smi", "cuda_in_image"):
        assert statuses[check] == "skip", check


def test_a_failed_check_exits_1_with_one_line_per_check(ansible_env, tmp_path):
    proc = verify(ansible_env, extra_env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(line.split(" ", 1)[0] in {"PASS", "FAIL", "SKIP"} for line in lines)
    checks = [line.split(":", 1)[0].split(" ", 1)[1] for line in lines]
    assert len(checks) == len(set(checks)), "each check is printed once"
    fails = [line for line in lines if line.startswith("FAIL gpu_host/docker_default_runtime: docker info failed")]
    assert len(fails) == 1
    assert "SKIP gpu_host/nvidia_smi: no NVIDIA GPU on the PCI bus" in lines


def test_usage_and_environment_errors_exit_2(ansible_env, tmp_path):
    proc = verify(ansible_env, "--bogus")
    assert proc.returncode == 2 and "unknown option --bogus" in proc.stderr
    proc = verify(ansible_env, "--limit", "no-such-host")
    assert proc.returncode == 2 and "no verdict" in proc.stderr
