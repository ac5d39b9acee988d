"""The compatibility contract (facts/nvidia.yml) against everything that ships: the images' CUDA runtime, the driver
role's default, every GPU profile of every inventory, on every supported release.

A profile that pairs a driver with images it cannot run (535 with the CUDA 13 images), a GPU with a branch that
does not drive it, or a GeForce card with open modules its branch refuses, fails here, through the driver role's
own plan filter: the same code that decides on a real host.
"""

from __future__ import annotations

import re

import pytest
import yaml

from dinops_testing import REPO, driver_plan_settings, load_plugin

plan = load_plugin("roles/nvidia_driver/filter_plugins/nvidia_driver_plan.py").dinops_nvidia_driver_plan
CONTRACT = yaml.safe_load((REPO / "facts/nvidia.yml").read_text())
DRIVER_DEFAULTS = yaml.safe_load((REPO / "roles/nvidia_driver/defaults/main.yml").read_text())
PROFILES = {
    f"{path.parent.parent.name}/{path.stem}": yaml.safe_load(path.read_text())["gpu_profile"]
    for path in sorted(REPO.glob("inventories/*/group_vars/*.yml"))
    if "gpu_profile:" in path.read_text()
}
KERNELS = {"ubuntu": ("6.8.0-142-generic", "generic"), "debian": ("6.1.0-37-cloud-amd64", "cloud-amd64")}


def host_settings(release, branch, kernel_modules, gpus, **overrides):
    kernel, flavour = KERNELS[release.split("-")[0]]
    return driver_plan_settings(
        release, kernel, flavour, branch=branch, kernel_modules=kernel_modules, gpus=gpus, **overrides
    )


def profile_gpu(profile):
    """The GPU of a profile as preflight reports it, from the contract's GPU table (profiles may use nvidia-smi's
    name, e.g. "NVIDIA H100 80GB HBM3": matched on the model word, memory, compute capability and generation)."""
    key = (profile["gpu_memory_gb"], str(profile["compute_capability"]), profile["architecture"])
    words = set(profile["gpu_name"].replace("NVIDIA ", "").replace("-", " ").split())
    entries = [
        e
        for e in CONTRACT["gpus"].values()
        if (e["memory_gb"], e["compute_capability"], e["generation"]) == key and e["name"].split()[0] in words
    ]
    assert entries, f"{profile['name']}: no GPU of the contract's table has {key}"
    assert len({e["datacenter"] for e in entries}) == 1, entries
    return {"architecture": key[2], "datacenter": entries[0]["datacenter"], "name": profile["gpu_name"]}


def test_the_images_cuda_runtime_is_the_one_their_torch_wheels_carry():
    constraints = (REPO / "apps/constraints.txt").read_text()
    (version,) = re.findall(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+\.\d+)\.", constraints, re.M)
    assert CONTRACT["images"]["cuda_runtime"] == version


def test_the_driver_roles_default_is_the_contracts():
    assert DRIVER_DEFAULTS["nvidia_driver_branch"] == CONTRACT["default_branch"]


@pytest.mark.parametrize("release", sorted(CONTRACT["releases"]))
def test_the_default_branch_runs_the_images_on_every_release_and_generation(release):
    for generation, facts in CONTRACT["generations"].items():
        if facts.get("max_branch", 10**6) < CONTRACT["cuda_min_branch"][CONTRACT["images"]["cuda_runtime"][0:2]]:
            continue  # Kepler: its last branch (470) cannot run CUDA 13; the images do not support it
        gpus = [{"architecture": generation, "datacenter": False, "name": f"{generation} GPU"}]
        result = plan(host_settings(release, CONTRACT["default_branch"], "auto", gpus))
        assert result["errors"] == [], (release, generation)


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("release", sorted(CONTRACT["releases"]))
def test_every_shipped_profile_drives_its_gpu_and_runs_the_images(profile, release):
    data = PROFILES[profile]
    result = plan(host_settings(release, data["driver_branch"], data["kernel_modules"], [profile_gpu(data)]))
    assert result["errors"] == []


def test_a_profile_that_pairs_535_with_the_cuda_13_images_is_refused():
    gpus = [{"architecture": "turing", "datacenter": True, "name": "Tesla T4"}]
    errors = plan(host_settings("ubuntu-22.04", "535", "open", gpus))["errors"]
    assert (
        "driver branch 535 cannot run the images' CUDA 13.0 runtime (it needs branch 580 or newer): use branch 580"
        in errors
    )
    assert (
        "driver branch 535 is not a real package set on ubuntu-22.04 (its packages are transitional to 580)"
        in errors[0]
    )


def test_geforce_with_open_modules_on_a_branch_before_545_is_refused():
    gpus = [{"architecture": "ampere", "datacenter": False, "name": "GeForce RTX 3090"}]
    errors = plan(host_settings("debian-12", "535", "open", gpus, source="debian"))["errors"]
    assert any("drive data-center GPUs only, not GeForce RTX 3090" in error for error in errors), errors
    auto = plan(host_settings("debian-12", "535", "auto", gpus, source="debian"))
    assert auto["flavour"] == "proprietary"


def test_every_profile_names_a_gpu_of_the_table_and_its_generation():
    for name, data in PROFILES.items():
        gpu = profile_gpu(data)
        assert data["architecture"] == gpu["architecture"], name
        assert data["kernel_modules"] in ("auto", "open", "proprietary"), name
