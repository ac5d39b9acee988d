"""The example inventory's GPU profiles: a host's resolved settings follow the group it is in."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from dinops_testing import REPO

EXAMPLE = REPO / "inventories/example"
PROFILES = ("rtx3060ti", "rtx3090")
PROFILE_KEYS = {
    "name",
    "gpu_name",
    "gpu_memory_gb",
    "compute_capability",
    "architecture",
    "driver_branch",
    "kernel_modules",
    "train_batch_size",
    "inference_batch_size",
    "amp",
    "shm_size",
    "data_loader_workers",
    "workloads",
    # the machine: read by the fit test (tests/k8s/test_fit.py) and the workloads role's sizing
    "host_vcpus",
    "host_memory_gb",
    "gpu_count",
}
GPU_TABLE = yaml.safe_load((REPO / "facts/nvidia.yml").read_text())["gpus"]


def inventory_host(env, inventory, host):
    out = subprocess.run(
        ["ansible-inventory", "-i", str(inventory), "--host", host],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return json.loads(out)


def resolved(env, inventory):
    """The role inputs as a play sees them (templates rendered), per host, without connecting to any host."""
    expr = (
        "{{ {'branch': nvidia_driver_branch, 'modules': nvidia_driver_kernel_modules,"
        " 'shm': docker_default_shm_size, 'profile': gpu_profile.name} }}"
    )
    out = subprocess.run(
        ["ansible", "gpu_hosts", "-i", str(inventory), "-m", "ansible.builtin.debug", "-a", f"msg={expr}"],
        env=dict(
            env,
            ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
            ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    # ansible.cfg's timing callbacks print lines around the JSON document.
    hosts = json.loads(out[out.index("{\n") : out.rindex("}") + 1])["plays"][0]["tasks"][0]["hosts"]
    return {host: result["msg"] for host, result in hosts.items()}


@pytest.fixture
def swapped_inventory(tmp_path):
    """A copy of the example inventory with infer-1 moved from the rtx3060ti group to rtx3090."""
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy)
    hosts_file = copy / "hosts.yml"
    hosts = yaml.safe_load(hosts_file.read_text())
    groups = hosts["all"]["children"]["gpu_hosts"]["children"]
    groups["rtx3090"]["hosts"]["infer-1"] = groups["rtx3060ti"]["hosts"].pop("infer-1")
    groups["rtx3060ti"]["hosts"] = None
    hosts_file.write_text(yaml.safe_dump(hosts))
    return copy


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_states_the_whole_contract(profile):
    data = yaml.safe_load((EXAMPLE / f"group_vars/{profile}.yml").read_text())["gpu_profile"]
    assert set(data) == PROFILE_KEYS
    assert data["name"] == profile
    assert data["kernel_modules"] in ("auto", "open", "proprietary")
    assert set(data["workloads"]) <= {"download", "train", "inference", "client"}


@pytest.mark.parametrize("profile", PROFILES)
def test_profiles_agree_with_the_preflight_gpu_table(profile):
    data = yaml.safe_load((EXAMPLE / f"group_vars/{profile}.yml").read_text())["gpu_profile"]
    assert (data["gpu_name"], data["gpu_memory_gb"], data["compute_capability"], data["architecture"]) in [
        (e["name"], e["memory_gb"], e["compute_capability"], e["generation"]) for e in GPU_TABLE.values()
    ]


def test_each_host_resolves_its_profile(ansible_env):
    infer = inventory_host(ansible_env, EXAMPLE, "infer-1")
    train = inventory_host(ansible_env, EXAMPLE, "train-1")
    assert (infer["gpu_profile"]["name"], infer["gpu_profile"]["gpu_memory_gb"]) == ("rtx3060ti", 8)
    assert infer["gpu_profile"]["workloads"] == ["inference", "client"]
    assert (train["gpu_profile"]["name"], train["gpu_profile"]["gpu_memory_gb"]) == ("rtx3090", 24)
    assert train["gpu_profile"]["workloads"] == ["download", "train", "inference"]
    assert infer["preflight_require_gpu"] is True
    assert resolved(ansible_env, EXAMPLE) == {
        "infer-1": {"branch": "580", "modules": "open", "shm": "2G", "profile": "rtx3060ti"},
        "train-1": {"branch": "580", "modules": "open", "shm": "8G", "profile": "rtx3090"},
    }


def test_moving_a_host_to_another_group_swaps_its_gpu_settings(ansible_env, swapped_inventory):
    before = inventory_host(ansible_env, EXAMPLE, "infer-1")
    after = inventory_host(ansible_env, swapped_inventory, "infer-1")
    train = inventory_host(ansible_env, EXAMPLE, "train-1")
    assert after["gpu_profile"] == train["gpu_profile"]
    assert after["gpu_profile"] != before["gpu_profile"]
    # Everything that is not the GPU profile stays as it was.
    assert {k: v for k, v in after.items() if k != "gpu_profile"} == {
        k: v for k, v in before.items() if k != "gpu_profile"
    }
    assert resolved(ansible_env, swapped_inventory)["infer-1"] == {
        "branch": "580",
        "modules": "open",
        "shm": "8G",
        "profile": "rtx3090",
    }
