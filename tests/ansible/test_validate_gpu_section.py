"""The validator's GPU checks that CI cannot run for real: driver_runs_images (the loaded driver against the
images' CUDA runtime, by facts/nvidia.yml) and cuda_in_image (files/cuda_in_image.py in the serve image).

The probe itself runs here on CPU, so its "CUDA unavailable" answer is parsed as printed. The verdicts are checked
three ways: the filters on real /proc banners and probe output, the role's vars rendered by ansible-playbook over
registered results of each host state, and the role's tasks on this machine posing as a GPU host.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dinops_testing import REPO, load_plugin, run_playbook

gpu = load_plugin("roles/validate/filter_plugins/validate_gpu.py")
ROLE = REPO / "roles" / "validate"
PROBE = ROLE / "files" / "cuda_in_image.py"
CONTRACT = yaml.safe_load((REPO / "facts" / "nvidia.yml").read_text())
DRIVER_REGEX = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__validate_driver_regex"]
EXIT_CUDA_ERROR, EXIT_NO_TORCH, EXIT_NO_CUDA = 1, 2, 3

# /proc/driver/nvidia/version as the open and the proprietary modules print it.
BANNER_580_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22-I3-AF03-09-1)"
    "  Tue Sep 23 09:01:43 UTC 2025\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04.2)\n"
)
BANNER_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
    "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
)
BUILD = "ansible-playbook -i inventories/local site.yml --tags images"
IMAGE = "dinops-serve:0.1.0-0123456789abcdef"
FOUND = {"images": [{"Id": "sha256:0123", "RepoTags": [IMAGE]}]}
# The probe's answer under a CUDA 13 PyTorch on a 535 driver (torch's own warning, shortened).
TOO_OLD = (
    "torch.cuda.is_available() is False: CUDA initialization: The NVIDIA driver on your system is too old "
    "(found version 12020). Please update your GPU driver."
)


def driver_version(banner: str) -> str:
    """What the role reads from the banner (its vars' regular expression)."""
    found = re.findall(DRIVER_REGEX, banner)
    return found[0] if found else ""


def run_probe(*python_flags: str) -> tuple[int, dict]:
    """files/cuda_in_image.py run as the role runs it (python3 -c), with this venv's PyTorch and no GPU."""
    proc = subprocess.run(
        [sys.executable, *python_flags, "-c", PROBE.read_text()],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        check=False,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    return proc.returncode, {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


@pytest.fixture(scope="module")
def cpu_probe():
    return run_probe()


def gpu_report(cpu_run: dict, devices: list[dict]) -> str:
    """The probe's JSON line on a GPU host: its CPU answer with what a GPU run fills in (same keys)."""
    report = json.loads(cpu_run["stdout"])
    report.update(cuda_available=True, error=None, devices=devices)
    return json.dumps(report, sort_keys=True)


H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.2}


# --- driver_runs_images ----------------------------------------------------------------------------------------------
def test_a_580_driver_runs_the_cuda_13_images():
    verdict = gpu.dinops_driver_runs_images(driver_version(BANNER_580_OPEN), CONTRACT, 1)
    assert verdict == {
        "status": "pass",
        "detail": "driver 580.95.05 (branch 580) runs the images' CUDA 13.0 runtime (needs branch >= 580)",
    }


def test_a_535_driver_fails_with_what_to_do():
    assert driver_version(BANNER_535) == "535.183.01"
    verdict = gpu.dinops_driver_runs_images(driver_version(BANNER_535), CONTRACT, 2)
    assert verdict == {
        "status": "fail",
        "detail": "driver 535.183.01 cannot run the images' CUDA 13.0 runtime (needs branch >= 580): "
        "set nvidia_driver_branch to 580 and run the gpu_hosts stage",
    }


def test_the_minimum_follows_the_images_cuda_major():
    cuda12 = {**CONTRACT, "images": {"cuda_runtime": "12.8"}}
    assert gpu.dinops_driver_runs_images("535.183.01", cuda12, 1)["status"] == "pass"
    assert gpu.dinops_driver_runs_images("470.256.02", cuda12, 1)["detail"] == (
        "driver 470.256.02 cannot run the images' CUDA 12.8 runtime (needs branch >= 525): "
        "set nvidia_driver_branch to 580 and run the gpu_hosts stage"
    )
    # The advice is the contract's default branch when it runs the images, else the minimum.
    cuda14 = {**CONTRACT, "images": {"cuda_runtime": "14.0"}, "cuda_min_branch": {"14": 600}}
    assert gpu.dinops_driver_runs_images("580.95.05", cuda14, 1)["detail"].endswith(
        "set nvidia_driver_branch to 600 and run the gpu_hosts stage"
    )


def test_no_driver_fails_on_a_gpu_host_and_skips_without_gpu():
    assert gpu.dinops_driver_runs_images(driver_version(""), CONTRACT, 1) == {
        "status": "fail",
        "detail": "no NVIDIA driver loaded to run the images' CUDA 13.0 runtime: "
        "set nvidia_driver_branch to 580 and run the gpu_hosts stage",
    }
    assert gpu.dinops_driver_runs_images("", CONTRACT, 0) == {
        "status": "skip",
        "detail": "no NVIDIA GPU on the PCI bus",
    }


def test_a_contract_without_the_images_runtime_is_an_error():
    with pytest.raises(gpu.AnsibleFilterError, match=r"images\.cuda_runtime"):
        gpu.dinops_driver_runs_images("580.95.05", {**CONTRACT, "images": {"cuda_runtime": "99.0"}}, 1)


# --- the probe, for real on CPU ---------------------------------------------------------------------------------------
def test_the_probe_reports_cuda_unavailable_with_its_own_exit_status(cpu_probe):
    status, run = cpu_probe
    report = json.loads(run["stdout"])
    assert status == EXIT_NO_CUDA
    assert set(report) == {"torch", "cuda", "cuda_available", "devices", "error"}
    assert (report["cuda_available"], report["devices"]) == (False, [])
    assert report["error"].startswith("torch.cuda.is_available() is False: ")
    assert report["torch"].split("+")[0].count(".") == 2


def test_the_probe_without_pytorch_says_so(tmp_path):
    status, run = run_probe("-I", "-S")  # no site-packages: PyTorch is not importable
    report = json.loads(run["stdout"])
    assert status == EXIT_NO_TORCH
    assert report["error"].startswith("PyTorch is not importable: ")
    assert set(report) == {"torch", "cuda", "cuda_available", "devices", "error"}


def test_the_probe_survives_templating_as_the_roles_argv():
    assert not {"{{", "{%", "{#"} & {m.group() for m in re.finditer(r"\{[{%#]", PROBE.read_text())}


# --- cuda_in_image ---------------------------------------------------------------------------------------------------
def test_the_real_cpu_answer_fails_on_a_gpu_host_and_skips_without_gpu(cpu_probe):
    _, run = cpu_probe
    report = json.loads(run["stdout"])
    verdict = gpu.dinops_cuda_in_image(run, 1, IMAGE, FOUND, BUILD, driver="580.95.05")
    assert verdict["status"] == "fail"
    assert verdict["detail"] == (
        f"{report['error']} (in {IMAGE}; torch {report['torch']}, CUDA {report['cuda']}, driver 580.95.05)"
    )
    assert gpu.dinops_cuda_in_image(run, 0, IMAGE, FOUND, BUILD) == {
        "status": "skip",
        "detail": "no NVIDIA GPU on the PCI bus",
    }


def test_a_gpu_that_computed_passes_with_device_torch_cuda_and_driver(cpu_probe):
    _, cpu_run = cpu_probe
    run = {"rc": 0, "stdout": gpu_report(cpu_run, [H100]) + "\n", "stderr": ""}
    torch_version = json.loads(cpu_run["stdout"])["torch"]
    assert gpu.dinops_cuda_in_image(run, 1, IMAGE, FOUND, BUILD, driver="580.95.05") == {
        "status": "pass",
        "detail": f"cuda:0 NVIDIA H100 80GB HBM3 (sm 9.0): allocated and multiplied on the GPU in {IMAGE}; "
        f"torch {torch_version}, CUDA 13.0, driver 580.95.05",
    }


def test_a_container_that_sees_fewer_gpus_than_the_bus_fails(cpu_probe):
    _, cpu_run = cpu_probe
    run = {"rc": 0, "stdout": gpu_report(cpu_run, [H100]), "stderr": ""}
    verdict = gpu.dinops_cuda_in_image(run, 2, IMAGE, FOUND, BUILD, driver="580.95.05")
    assert verdict["status"] == "fail"
    assert verdict["detail"].startswith("the container computed on 1 of 2 GPUs: cuda:0 NVIDIA H100 80GB HBM3 (sm 9.0)")


def test_a_missing_image_fails_with_the_command_that_builds_it():
    assert gpu.dinops_cuda_in_image({}, 1, IMAGE, {"images": []}, BUILD) == {
        "status": "fail",
        "detail": f"image {IMAGE} is not on this host: build it with `{BUILD}`",
    }
    unreachable = {"failed": True, "msg": "Error connecting: Error while fetching server API version"}
    assert gpu.dinops_cuda_in_image({}, 1, IMAGE, unreachable, BUILD)["detail"] == (
        f"could not ask Docker for {IMAGE}: Error connecting: Error while fetching server API version"
    )


def test_docker_refusing_the_gpu_request_reports_dockers_error():
    # What `docker run --gpus all` answers when no NVIDIA runtime is configured (seen on this CPU machine).
    run = {
        "rc": 125,
        "stdout": "",
        "stderr": 'docker: Error response from daemon: could not select device driver "" with capabilities: '
        "[[gpu]].\n\nRun 'docker run --help' for more information\n",
    }
    assert gpu.dinops_cuda_in_image(run, 1, IMAGE, FOUND, BUILD)["detail"] == (
        f"docker run --gpus all {IMAGE} failed (exit 125): docker: Error response from daemon: could not select "
        'device driver "" with capabilities: [[gpu]].'
    )


def test_a_cuda_error_in_the_container_fails_with_it(cpu_probe):
    _, cpu_run = cpu_probe
    report = json.loads(gpu_report(cpu_run, []))
    report["error"] = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    run = {"rc": EXIT_CUDA_ERROR, "stdout": json.dumps(report), "stderr": ""}
    detail = gpu.dinops_cuda_in_image(run, 1, IMAGE, FOUND, BUILD, driver="580.95.05")["detail"]
    assert detail.startswith("RuntimeError: CUDA error: no kernel image is available for execution on the device (in ")


# --- the role's vars over registered results -------------------------------------------------------------------------
def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def host_state(*, pci=1, banner=BANNER_580_OPEN, smi=("NVIDIA H100 80GB HBM3, 580.95.05, 81559 MiB",), state=None,
               image_info=FOUND, run=None, **extra):  # fmt: skip
    """Registered results of the gpu_host section's tasks on a host in some state."""
    variables = {
        "__validate_pci_result": {"stdout": str(pci)},
        "__validate_runtime_result": {"rc": 0, "stdout": "nvidia\n" if pci else "runc\n"},
        **extra,
    }
    if pci:
        variables |= {
            "__validate_driver_result": {"content": b64(banner)} if banner else {"failed": True},
            "__validate_smi_result": {"rc": 0, "stdout_lines": list(smi)},
            "__validate_images_result": {"content": b64(json.dumps(state))} if state else {"failed": True},
            "__validate_cuda_image_result": image_info,
        }
        if run is not None:
            variables["__validate_cuda_run_result"] = run
    return variables


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory, cpu_probe):
    _, cpu_run = cpu_probe
    passing = {"rc": 0, "stdout": gpu_report(cpu_run, [H100]), "stderr": ""}
    too_old = {**json.loads(cpu_run["stdout"]), "error": TOO_OLD}
    states = {
        "cpu": host_state(pci=0),
        "healthy": host_state(state={"serve": IMAGE, "train": "dinops-train:0.1.0-fedcba9876543210"}, run=passing),
        "old-driver": host_state(
            banner=BANNER_535, state={"serve": IMAGE}, run={"rc": EXIT_NO_CUDA, "stdout": json.dumps(too_old)}
        ),
        "no-image": host_state(
            image_info={"images": []}, dinops_registry="registry.local:5000", dinops_image_tag="0.2.0"
        ),
        "train-image": host_state(
            state={"serve": IMAGE, "train": "dinops-train:0.1.0-fedcba9876543210"},
            run=passing,
            validate_cuda_app="train",
        ),
    }
    tmp = tmp_path_factory.mktemp("validate-gpu")
    tasks = [
        {
            "name": f"Render {name}",
            "vars": variables,
            "ansible.builtin.copy": {
                "content": "{{ __validate_gpu_host_results | to_json }}",
                "dest": str(tmp / f"{name}.json"),
                "mode": "0644",
            },
        }
        for name, variables in states.items()
    ]
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            # The role's own defaults and vars, as the role sees them (role_path is the role's directory there).
            "vars": {"role_path": str(ROLE)},
            "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
            "tasks": tasks,
        }
    ]
    run_playbook(
        tmp, play, inventory=str(REPO / "inventories" / "local"), config=f"filter_plugins = {ROLE / 'filter_plugins'}\n"
    )
    return {
        name: {r["check"]: (r["status"], r["detail"]) for r in json.loads((tmp / f"{name}.json").read_text())}
        for name in states
    }


CHECKS = ["driver_loaded", "driver_runs_images", "nvidia_smi", "docker_default_runtime", "cuda_in_image"]


def statuses(verdict):
    return [verdict[check][0] for check in CHECKS]


def test_rendered_cpu_host_skips_every_gpu_check(verdicts):
    assert list(verdicts["cpu"]) == CHECKS
    assert statuses(verdicts["cpu"]) == ["skip", "skip", "skip", "pass", "skip"]


def test_rendered_healthy_gpu_host_passes_with_the_image_the_images_stage_recorded(verdicts):
    verdict = verdicts["healthy"]
    assert statuses(verdict) == ["pass"] * 5
    assert verdict["driver_runs_images"][1].startswith("driver 580.95.05 (branch 580) runs the images' CUDA 13.0")
    assert f"allocated and multiplied on the GPU in {IMAGE}; " in verdict["cuda_in_image"][1]
    assert verdict["cuda_in_image"][1].endswith(", CUDA 13.0, driver 580.95.05")


def test_rendered_old_driver_fails_both_checks_with_what_to_do(verdicts):
    verdict = verdicts["old-driver"]
    assert statuses(verdict) == ["pass", "fail", "pass", "pass", "fail"]
    assert verdict["driver_runs_images"][1] == (
        "driver 535.183.01 cannot run the images' CUDA 13.0 runtime (needs branch >= 580): "
        "set nvidia_driver_branch to 580 and run the gpu_hosts stage"
    )
    assert verdict["cuda_in_image"][1].startswith(TOO_OLD + f" (in {IMAGE}; torch ")


def test_rendered_missing_image_names_the_reference_and_the_build_command(verdicts):
    verdict = verdicts["no-image"]
    assert verdict["cuda_in_image"] == (
        "fail",
        "image registry.local:5000/dinops-serve:0.2.0 is not on this host: "
        "build it with `ansible-playbook -i inventories/local site.yml --tags images`",
    )


def test_rendered_train_image_is_taken_from_the_state_file(verdicts):
    assert "in dinops-train:0.1.0-fedcba9876543210; " in verdicts["train-image"]["cuda_in_image"][1]


# --- the role's tasks, this machine posing as a GPU host -------------------------------------------------------------
def test_the_tasks_on_a_gpu_host_without_the_image_fail_with_the_build_command(ansible_env, tmp_path):
    """The PCI count is overridden (extra vars beat registered results), so the GPU-only tasks run for real: the
    driver banner is missing, docker_image_info looks for an image that is not there, nothing is pulled."""
    report = tmp_path / "verify.json"
    image = "dinops-serve:absent-for-test"
    extra = {"__validate_pci_result": {"stdout": "1"}, "validate_cuda_app_image": image}
    proc = subprocess.run(
        ["ansible-playbook", "playbooks/verify.yml", "-e", f"validate_report_path={report}", "-e", json.dumps(extra)],
        cwd=REPO, env=ansible_env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    verdict = json.loads(report.read_text())
    checks = {r["check"]: r for r in verdict["hosts"]["localhost"] if r["section"] == "gpu_host"}
    assert proc.returncode != 0 and verdict["passed"] is False
    cuda = checks["cuda_in_image"]
    assert cuda["status"] == "fail"
    docker = subprocess.run(["docker", "info"], env=ansible_env, capture_output=True, timeout=60, check=False)
    if docker.returncode == 0:
        assert cuda["detail"] == (
            f"image {image} is not on this host: build it with "
            "`ansible-playbook -i inventories/local site.yml --tags images`"
        )
    else:
        assert cuda["detail"].startswith(f"could not ask Docker for {image}: ")
    if not Path("/proc/driver/nvidia/version").exists():
        assert checks["driver_runs_images"]["status"] == "fail"
        assert checks["driver_runs_images"]["detail"].startswith("no NVIDIA driver loaded to run the images' CUDA 13.0")
