"""Driver selection for every supported release and GPU generation (Ubuntu cannot be built in CI)."""

from __future__ import annotations

import pytest
import yaml

from dinops_testing import REPO, load_plugin

plan = load_plugin("roles/nvidia_driver/filter_plugins/nvidia_driver_plan.py").dinops_nvidia_driver_plan
DEFAULTS = yaml.safe_load((REPO / "roles/nvidia_driver/defaults/main.yml").read_text())
RELEASES = DEFAULTS["nvidia_driver_releases"]
KERNELS = {
    "ubuntu-20.04": "5.15.0-126-generic",
    "ubuntu-22.04": "6.8.0-60-generic",
    "ubuntu-24.04": "6.8.0-60-generic",
    "debian-12": "6.1.0-37-amd64",
}
# Generation -> (branch to ask for, expected flavour under 'auto').
GENERATIONS = {
    "kepler": ("470", "proprietary"),
    "maxwell": ("535", "proprietary"),
    "pascal": ("535", "proprietary"),
    "volta": ("535", "proprietary"),
    "turing": ("535", "open"),
    "ampere": ("535", "open"),
    "ada": ("535", "open"),
    "hopper": ("535", "open"),
    "blackwell": ("570", "open"),
}


def settings(release="ubuntu-22.04", gpus=("ampere",), **overrides):
    os_id, os_version = release.split("-")
    base = {
        "os_id": os_id,
        "os_version": os_version,
        "kernel": KERNELS[release],
        "gpus": [{"architecture": arch, "name": f"{arch} GPU"} for arch in gpus],
        "branch": DEFAULTS["nvidia_driver_branch"],
        "kernel_modules": DEFAULTS["nvidia_driver_kernel_modules"],
        "server": DEFAULTS["nvidia_driver_server"],
        "headless": DEFAULTS["nvidia_driver_headless"],
        "prebuilt_modules": DEFAULTS["nvidia_driver_prebuilt_modules"],
        "secure_boot": "disabled",
        "secure_boot_mok_enrolled": False,
        "releases": RELEASES,
    }
    base.update(overrides)
    return base


def test_every_supported_release_has_a_table_entry():
    assert sorted(RELEASES) == ["debian-12", "ubuntu-20.04", "ubuntu-22.04", "ubuntu-24.04"]
    assert all(DEFAULTS["nvidia_driver_branch"] in entry["branches"] for entry in RELEASES.values())


@pytest.mark.parametrize("release", sorted(KERNELS))
@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_flavour_and_packages_for_every_release_and_generation(release, generation):
    branch, flavour = GENERATIONS[generation]
    result = plan(settings(release, gpus=[generation], branch=branch))
    if branch not in RELEASES[release]["branches"]:
        assert result["errors"] == [
            f"driver branch {branch} is not available on {release} (known: {', '.join(RELEASES[release]['branches'])});"
            " choose one of those or extend nvidia_driver_releases"
        ]
        return
    assert result["errors"] == []
    assert result["flavour"] == flavour
    assert result["pin_version"] == f"{branch}.*"
    kernel = KERNELS[release]
    if release.startswith("ubuntu"):
        variant = "-server-open" if flavour == "open" else "-server"
        assert result["packages"] == [
            f"nvidia-headless-no-dkms-{branch}{variant}",
            f"nvidia-utils-{branch}-server",
            f"libnvidia-compute-{branch}-server",
            f"linux-modules-nvidia-{branch}{variant}-{kernel}",
        ]
        assert result["hold"] == result["packages"]
        assert result["signed_modules"] is True
    else:
        dkms = "nvidia-open-kernel-dkms" if flavour == "open" else "nvidia-kernel-dkms"
        held = [dkms, "firmware-nvidia-gsp", "nvidia-smi", "libcuda1", "nvidia-persistenced"]
        assert result["hold"] == held
        assert result["packages"] == [*held, f"linux-headers-{kernel}"]
        assert result["signed_modules"] is False


def test_ubuntu_desktop_packages_with_dkms_get_the_running_kernels_headers():
    result = plan(settings("ubuntu-24.04", server=False, headless=False, prebuilt_modules=False))
    assert result["packages"] == [
        "nvidia-driver-535-open",
        "nvidia-utils-535",
        "libnvidia-compute-535",
        "linux-headers-6.8.0-60-generic",
    ]
    assert result["hold"] == ["nvidia-driver-535-open", "nvidia-utils-535", "libnvidia-compute-535"]


def test_ubuntu_headless_dkms_variant():
    result = plan(settings("ubuntu-20.04", gpus=["pascal"], prebuilt_modules=False))
    assert result["packages"][0] == "nvidia-headless-535-server"


def test_debian_desktop_adds_the_driver_metapackage_and_ignores_server():
    result = plan(settings("debian-12", gpus=["turing"], headless=False))
    assert "nvidia-driver" in result["hold"]
    assert result["notes"] == ["Debian has no -server driver packages: nvidia_driver_server is ignored"]


def test_override_proprietary_on_a_capable_gpu():
    result = plan(settings(kernel_modules="proprietary"))
    assert (result["flavour"], result["flavour_reason"]) == ("proprietary", "requested by nvidia_driver_kernel_modules")
    assert result["packages"][0] == "nvidia-headless-no-dkms-535-server"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpus": ["pascal"], "kernel_modules": "open"}, "the open kernel modules do not support pascal GPUs"),
        ({"gpus": ["blackwell"], "branch": "570", "kernel_modules": "proprietary"}, "open kernel modules only"),
        ({"gpus": ["pascal", "blackwell"], "branch": "570"}, "no single driver drives both"),
        ({"gpus": ["hopper"], "branch": "470"}, "hopper GPUs need driver branch 525 or newer, not 470"),
        ({"gpus": ["kepler"], "branch": "535"}, "kepler GPUs are supported up to driver branch 470, not 535"),
        ({"gpus": [], "branch": "470", "kernel_modules": "open"}, "the open kernel modules exist from branch 515 on"),
        ({"kernel_modules": "closed"}, "nvidia_driver_kernel_modules must be one of auto, open, proprietary"),
        ({"branch": "latest"}, "nvidia_driver_branch must be a branch number like '535', got 'latest'"),
        ({"os_version": "18.04"}, "ubuntu-18.04 is not a supported release"),
    ],
)
def test_impossible_combinations_are_refused_with_the_reason(overrides, message):
    errors = plan(settings(**overrides))["errors"]
    assert any(message in error for error in errors), errors


def test_secure_boot_with_unsigned_dkms_modules_stops_unless_a_key_is_enrolled():
    refused = plan(settings("debian-12", secure_boot="enabled"))
    assert len(refused["errors"]) == 1
    assert refused["errors"][0].startswith("Secure Boot is enabled and the kernel module would be built by DKMS")
    assert plan(settings("debian-12", secure_boot="enabled", secure_boot_mok_enrolled=True))["errors"] == []
    ubuntu_dkms = plan(settings("ubuntu-22.04", secure_boot="enabled", prebuilt_modules=False))
    assert "Keep nvidia_driver_prebuilt_modules true" in ubuntu_dkms["errors"][0]
    assert plan(settings("ubuntu-22.04", secure_boot="enabled"))["errors"] == []


def test_unknown_secure_boot_state_is_noted():
    assert plan(settings(secure_boot="unknown"))["notes"] == [
        "Secure Boot state unknown (no EFI variables): assuming it is off"
    ]


@pytest.mark.parametrize(
    ("gpus", "branch", "flavour"),
    [
        ([], "535", "proprietary"),
        ([], "570", "open"),
        (["unknown"], "535", "proprietary"),
        ([""], "570", "proprietary"),
    ],
)
def test_hosts_without_a_known_gpu(gpus, branch, flavour):
    result = plan(settings("ubuntu-22.04", gpus=gpus, branch=branch))
    assert result["errors"] == []
    assert result["flavour"] == flavour
