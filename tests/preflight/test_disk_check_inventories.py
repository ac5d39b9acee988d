"""Preflight's free-disk check as the role runs it, on the shipped inventories (round2 F7).

The role's tasks run through ansible-playbook on the controller: the checks with the host's measurements given by the
test (nothing connects to a host, nothing is written), the measurement itself on this machine in a temporary
directory. On the local inventory the cluster and the demo follow ansible_local.dinops, which preflight writes only
after its checks: the GPU plan is checked from the run after the driver's reboot, which is the first to store much.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dinops_testing import REPO

GB = 10**9
A10G = {"pci_id": "10de:2237", "name": "NVIDIA A10G", "architecture": "ampere", "datacenter": True, "known": True}


def play(tmp_path, inventory, playbook, *args):
    """Run ``playbook`` with the repository's configuration, the JSON callback and no facts from the project's cache
    (.cache/ansible-facts). The role's dependency apt_lists would refresh apt's lists on the host: an empty role of
    that name stands in. Returns the finished process and the first play's tasks."""
    stub = tmp_path / "roles/apt_lists/tasks"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "main.yml").write_text("---\n[]\n")
    (tmp_path / "play.yml").write_text(playbook)
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=f"{tmp_path / 'roles'}:{REPO / 'roles'}",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_CACHE_PLUGIN="ansible.builtin.memory",
    )
    result = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), str(tmp_path / "play.yml"), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = result.stdout
    assert "{\n" in out, out[-3000:] + result.stderr[-3000:]
    return result, json.loads(out[out.index("{\n") : out.rindex("}") + 1])["plays"][0]["tasks"]


# --- The check --------------------------------------------------------------------------------------------------

CHECKS = """
- name: Preflight's checks on a host measured by the test
  hosts: gpu_hosts
  gather_facts: false
  tasks:
    - name: Take the test's measurements as preflight's own
      ansible.builtin.set_fact:
        __preflight_gpus: "{{ test_gpus }}"
        __preflight_host:
          memory_mb: 16000
          cpus: 4
          disk_free_gb: "{{ (test_free_bytes | int / 1024**3) | int }}"
          disk_free_bytes: "{{ test_free_bytes | int }}"
          disk_stored_bytes: 0
          disk_mount: /
          shm_mb: 8000
          secure_boot: disabled
    - name: Run the role's checks
      ansible.builtin.include_role:
        name: preflight
        tasks_from: checks.yml
"""


def run_checks(tmp_path, inventory, gpus, free_gb, fact=True, extra=None):
    """The role's checks; {host: "task: message" of the failed check, or None when all passed}. ``fact``: the host
    has preflight's fact file from an earlier run (ansible_local.dinops with these GPUs), as after the GPU VM's
    reboot; without it inventories/local plans the CPU demo. ``extra``: more extra variables, as with -e."""
    extra = {**(extra or {}), "test_gpus": gpus, "test_free_bytes": int(free_gb * GB)}
    if fact:
        extra["ansible_local"] = {"dinops": {"gpu_count": len(gpus)}}
    (tmp_path / "vars.json").write_text(json.dumps(extra))
    result, tasks = play(tmp_path, inventory, CHECKS, "-e", f"@{tmp_path / 'vars.json'}")
    outcome = {host: None for task in tasks for host in task["hosts"]}
    for task in tasks:
        for host, value in task["hosts"].items():
            if value.get("failed"):
                outcome[host] = f"{task['task']['name']}: {value.get('msg')}"
    assert (result.returncode == 0) == all(message is None for message in outcome.values()), result.stdout[-3000:]
    return outcome


def test_a_gpu_vm_with_30_gb_free_stops_before_the_run_fills_it(tmp_path):
    """The g5.xlarge of the audit on a 30 GB root disk, on the run after the driver's reboot (the fact file says one
    GPU): the check counts what the GPU path stores (minikube, COCO, Prometheus' 10Gi claim) before the images and the
    dataset: 73 GB (COCO 41, the images twice 12.8, Prometheus 10.7, the wheelhouse twice 6, minikube 2.5)."""
    (failure,) = run_checks(tmp_path, REPO / "inventories/local", [A10G], 30).values()
    assert (failure or "").startswith("preflight : checks | Assert enough free disk under the Docker data root")
    assert "this host's run stores about 73 GB there at its peak" in failure
    assert "COCO 2017 while it is extracted" in failure
    assert "Prometheus' time series (its claim dinops-prometheus-data, 10Gi by default) 10.7 GB" in failure


def test_the_first_run_before_the_fact_plans_the_demo_and_stops_at_the_reboot_anyway(tmp_path):
    """Without the fact file inventories/local plans the CPU demo (14.6 GB); that run stores only the driver before
    REBOOT REQUIRED, and the next one is checked against the GPU plan (above)."""
    assert run_checks(tmp_path, REPO / "inventories/local", [A10G], 30, fact=False) == {"localhost": None}


def test_a_gpu_vm_with_room_for_the_run_passes(tmp_path):
    """80 GB free hold the 73 GB above."""
    assert run_checks(tmp_path, REPO / "inventories/local", [A10G], 80) == {"localhost": None}


def test_the_inventorys_prometheus_settings_reach_the_estimate(tmp_path):
    """workloads_prometheus_volume_size from the inventory sizes the claim (50Gi: 53.7 GB, 73 - 10.7 + 53.7 = 116 GB);
    workloads_monitoring false leaves it out (62.3 GB); a size that is not a quantity stops the run with its name."""
    bigger = run_checks(
        tmp_path, REPO / "inventories/local", [A10G], 80, extra={"workloads_prometheus_volume_size": "50Gi"}
    )
    assert "this host's run stores about 116 GB there at its peak" in bigger["localhost"]
    assert "workloads_prometheus_volume_size 50Gi) 53.7 GB" in bigger["localhost"]
    assert run_checks(tmp_path, REPO / "inventories/local", [A10G], 63, extra={"workloads_monitoring": False}) == {
        "localhost": None
    }
    wrong = run_checks(
        tmp_path, REPO / "inventories/local", [A10G], 80, extra={"workloads_prometheus_volume_size": "big"}
    )
    assert "workloads_prometheus_volume_size) must be a Kubernetes quantity like 10Gi" in wrong["localhost"]


def test_the_cpu_demo_passes_with_less_than_the_old_20_gb(tmp_path):
    """A host without GPU runs the demo on the Docker runtime with synthetic data: 14.6 GB (the images 6.4, the
    wheelhouse twice 6, Prometheus' 2Gi claim 2.1, the shapes 0.1), not COCO's."""
    assert run_checks(tmp_path, REPO / "inventories/local", [], 15) == {"localhost": None}


def test_the_example_fleet_asks_only_the_training_host_for_coco(tmp_path):
    """rtx3060ti lists inference and client only (26 GB: the images twice 12.8, minikube 2.5, Prometheus 10.7);
    rtx3090 downloads COCO (67 GB: 41 more)."""
    outcome = run_checks(tmp_path, REPO / "inventories/example", [A10G], 40)
    assert outcome["infer-1"] is None
    assert "this host's run stores about 67 GB there at its peak" in outcome["train-1"]


# --- The role's inputs ------------------------------------------------------------------------------------------

RESOLVE = """
- name: Resolve the role's disk plan as its argument spec validates it
  hosts: gpu_hosts
  gather_facts: false
  roles:
    - role: preflight
  tasks:
    - name: Print the plan
      ansible.builtin.debug:
        msg: "{{ preflight_disk_plan }}"
      tags: [resolve]
    - name: Print where free disk is measured
      ansible.builtin.debug:
        msg: "{{ preflight_docker_data_root }}"
      tags: [resolve]
"""


@pytest.mark.parametrize(
    ("inventory", "expected"),
    [
        # No GPU facts: the local inventory's own choice, before the checks resolve it with the GPUs found.
        ("local", {"localhost": ("docker", "airgap", True, True, True, "")}),
        (
            "example",
            {
                "infer-1": ("minikube", "pull", False, False, True, ""),
                "train-1": ("minikube", "pull", False, False, True, ""),
            },
        ),
    ],
)
def test_the_argument_spec_accepts_the_plan_each_inventory_resolves(tmp_path, inventory, expected):
    """Role argument validation (tagged always) runs on the templated defaults; the role's own tasks are skipped."""
    result, tasks = play(tmp_path, REPO / "inventories" / inventory, RESOLVE, "--tags", "resolve")
    assert result.returncode == 0, result.stdout[-3000:]
    (validation,) = [task for task in tasks if "Validating arguments against arg spec 'main'" in task["task"]["name"]]
    assert set(validation["hosts"]) == set(expected)
    assert not any(value.get("skipped") or value.get("failed") for value in validation["hosts"].values())
    (debug,) = [task for task in tasks if task["task"]["name"] == "Print the plan"]
    resolved = {
        host: (value["msg"]["cluster"], value["msg"]["images_mode"], value["msg"]["controller_is_host"],
               value["msg"]["demo"], value["msg"]["monitoring"], value["msg"]["prometheus_volume_size"])
        for host, value in debug["hosts"].items()
    }  # fmt: skip
    assert resolved == expected


# --- The measurement --------------------------------------------------------------------------------------------

MEASURE = """
- name: Preflight's measurement of the disk
  hosts: localhost
  gather_facts: true
  gather_subset: [min, hardware, virtual]
  tasks:
    - name: Measure the host as the role does
      ansible.builtin.include_role:
        name: preflight
        tasks_from: hardware.yml
    - name: Print the summary
      ansible.builtin.debug:
        msg: "{{ __preflight_host }}"
"""


def test_what_earlier_runs_stored_is_measured_on_the_data_roots_filesystem_only(tmp_path):
    """Each stored path counted once (one nested in another), a path on another filesystem (/dev/shm) not at all."""
    data_root = tmp_path / "docker"
    (data_root / "overlay2").mkdir(parents=True)
    (data_root / "overlay2/layer").write_bytes(b"\0" * 3_000_000)
    other = tmp_path / "dinops"
    other.mkdir()
    (other / "wheel.whl").write_bytes(b"\0" * 2_000_000)
    elsewhere = Path("/dev/shm") / f"dinops-preflight-test-{os.getpid()}"
    elsewhere.mkdir()
    try:
        (elsewhere / "big").write_bytes(b"\0" * 5_000_000)
        settings = {
            "preflight_docker_data_root": str(data_root),
            "preflight_disk_stored_paths": [str(data_root), str(data_root / "overlay2"), str(other), str(elsewhere),
                                            str(tmp_path / "absent")],
            "ansible_python_interpreter": sys.executable,
        }  # fmt: skip
        (tmp_path / "vars.json").write_text(json.dumps(settings))
        result, tasks = play(tmp_path, "localhost,", MEASURE, "-c", "local", "-e", f"@{tmp_path / 'vars.json'}")
    finally:
        shutil.rmtree(elsewhere)
    assert result.returncode == 0, result.stdout[-3000:]
    (summary,) = [task for task in tasks if task["task"]["name"] == "Print the summary"]
    host = summary["hosts"]["localhost"]["msg"]
    du = subprocess.run(["du", "-sxbc", str(data_root), str(other)], capture_output=True, text=True, check=True)
    assert int(host["disk_stored_bytes"]) == int(du.stdout.splitlines()[-1].split()[0])
    assert 5_000_000 <= int(host["disk_stored_bytes"]) < 5_100_000
    assert int(host["disk_free_bytes"]) > 0


@pytest.mark.parametrize(
    ("extra", "data_root"),
    [([], "/var/lib/docker"), (["-e", "docker_data_root=/srv/dinops/docker"], "/srv/dinops/docker")],
)
def test_free_disk_is_measured_where_the_docker_role_puts_the_data_root(tmp_path, extra, data_root):
    """inventories/aws sets docker_data_root on its data volume: preflight measures that filesystem, not the root."""
    result, tasks = play(tmp_path, REPO / "inventories/example", RESOLVE, "--tags", "resolve", *extra)
    assert result.returncode == 0, result.stdout[-3000:]
    (debug,) = [task for task in tasks if task["task"]["name"] == "Print where free disk is measured"]
    assert {value["msg"] for value in debug["hosts"].values()} == {data_root}
