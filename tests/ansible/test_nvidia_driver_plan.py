"""Driver selection for every supported release and GPU generation (Ubuntu cannot be built in CI).

The facts come from the compatibility contract (facts/nvidia.yml); tests/ansible/test_ubuntu_archive.py runs the
package sets through real apt against Ubuntu's dependency graph.
"""

from __future__ import annotations

import pytest
import yaml

from dinops_testing import REPO, driver_plan_settings, load_plugin

filters = load_plugin("roles/nvidia_driver/filter_plugins/nvidia_driver_plan.py")
plan = filters.dinops_nvidia_driver_plan
CONTRACT = yaml.safe_load((REPO / "facts/nvidia.yml").read_text())
DEFAULTS = yaml.safe_load((REPO / "roles/nvidia_driver/defaults/main.yml").read_text())
KERNELS = {
    "ubuntu-20.04": ("5.15.0-126-generic", "generic-hwe-20.04"),
    "ubuntu-22.04": ("6.8.0-60-generic", "generic"),
    "ubuntu-24.04": ("6.8.0-60-aws", "aws"),
    "debian-12": ("6.1.0-37-cloud-amd64", "cloud-amd64"),
}
# Generation -> expected flavour under 'auto' with the default branch 580.
GENERATIONS = {
    "maxwell": "proprietary",
    "pascal": "proprietary",
    "volta": "proprietary",
    "turing": "open",
    "ampere": "open",
    "ada": "open",
    "hopper": "open",
    "blackwell": "open",
}


def settings(release="ubuntu-22.04", gpus=("ampere",), datacenter=True, **overrides):
    kernel, flavour = KERNELS[release]
    gpus = [{"architecture": arch, "datacenter": datacenter, "name": f"{arch} GPU"} for arch in gpus]
    settings = driver_plan_settings(release, kernel, flavour, gpus=gpus)
    settings.update(overrides)
    return settings


@pytest.mark.parametrize("release", sorted(KERNELS))
@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_flavour_and_packages_for_every_release_and_generation(release, generation):
    flavour = GENERATIONS[generation]
    result = plan(settings(release, gpus=[generation]))
    assert result["errors"] == []
    assert (result["flavour"], result["branch"]) == (flavour, "580")
    kernel, kflavour = KERNELS[release]
    if release.startswith("ubuntu"):
        variant = "-server-open" if flavour == "open" else "-server"
        assert result["packages"] == [
            f"nvidia-headless-no-dkms-580{variant}",
            "nvidia-utils-580-server",
            "libnvidia-compute-580-server",
            # The flavour metapackage: follows kernel updates (ubuntu-drivers installs the same).
            f"linux-modules-nvidia-580{variant}-{kflavour}",
        ]
        assert result["not_transitional"] == result["packages"]
        assert (result["source"], result["version_package"]) == ("ubuntu", "libnvidia-compute-580-server")
        assert result["signed_modules"] is True
    else:
        dkms = "nvidia-kernel-open-dkms" if flavour == "open" else "nvidia-kernel-dkms"
        assert result["packages"] == ["nvidia-driver-cuda", dkms, "linux-headers-cloud-amd64"]
        assert result["pin"]["version"] == "580.*" and "libcuda*" in result["pin"]["packages"]
        assert (result["source"], result["version_package"]) == ("nvidia", "nvidia-driver-cuda")
        assert result["signed_modules"] is False


def test_without_a_known_kernel_flavour_the_running_kernels_module_is_installed():
    result = plan(settings("ubuntu-22.04", kernel_flavour=""))
    assert result["packages"][-1] == "linux-modules-nvidia-580-server-open-6.8.0-60-generic"


def test_ubuntu_desktop_packages_with_dkms_get_the_headers_metapackage():
    result = plan(settings("ubuntu-24.04", server=False, headless=False, prebuilt_modules=False))
    assert result["packages"] == [
        "nvidia-driver-580-open",
        "nvidia-utils-580",
        "libnvidia-compute-580",
        "linux-headers-aws",
    ]


def test_debian_archive_route_is_535_and_cannot_run_the_images():
    result = plan(settings("debian-12", gpus=["turing"], source="debian", branch="535"))
    assert result["errors"] == [
        "driver branch 535 cannot run the images' CUDA 13.0 runtime (it needs branch 580 or newer): use branch 580"
    ]
    assert result["packages"][:2] == ["nvidia-open-kernel-dkms", "firmware-nvidia-gsp"]


def test_nvswitch_hosts_get_fabric_manager_with_the_server_driver():
    result = plan(settings("ubuntu-22.04", nvswitch_count=6))
    assert result["packages"][-1] == "nvidia-fabricmanager-580"
    assert result["services"] == ["nvidia-fabricmanager"]
    desktop = plan(settings("ubuntu-22.04", nvswitch_count=6, server=False))
    assert any("Fabric Manager, which requires the -server driver" in e for e in desktop["errors"])
    debian = plan(settings("debian-12", nvswitch_count=6))
    assert "nvidia-fabricmanager" in debian["packages"]


def test_a_branch_and_flavour_change_releases_holds_and_removes_the_old_set():
    installed = [
        "nvidia-headless-no-dkms-535-server-open",
        "nvidia-kernel-source-535-server-open",
        "nvidia-utils-535-server",
        "libnvidia-compute-535-server",
        "linux-modules-nvidia-535-server-open-6.8.0-60-generic",
        "linux-modules-nvidia-580-server-open-generic",
        "nvidia-kernel-source-580-server-open",
        "linux-image-generic",
        "nvidia-container-toolkit",
    ]
    held = [
        "nvidia-headless-no-dkms-535-server-open",
        "linux-modules-nvidia-535-server-open-6.8.0-60-generic",
        "linux-image-generic",
    ]
    result = plan(settings("ubuntu-22.04", kernel_modules="proprietary", installed=installed, held=held))
    assert result["remove"] == [
        "libnvidia-compute-535-server",
        "linux-modules-nvidia-535-server-open-6.8.0-60-generic",
        "linux-modules-nvidia-580-server-open-generic",
        "nvidia-headless-no-dkms-535-server-open",
        "nvidia-kernel-source-535-server-open",
        "nvidia-kernel-source-580-server-open",
        "nvidia-utils-535-server",
    ]
    # Only the driver's holds are released; the user's other holds stay.
    assert result["unhold"] == [
        "linux-modules-nvidia-535-server-open-6.8.0-60-generic",
        "nvidia-headless-no-dkms-535-server-open",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpus": ["pascal"], "kernel_modules": "open"}, "the open kernel modules do not support pascal GPUs"),
        ({"gpus": ["blackwell"], "kernel_modules": "proprietary"}, "open kernel modules only"),
        ({"gpus": ["pascal", "blackwell"]}, "no single driver drives both"),
        ({"gpus": ["hopper"], "branch": "470"}, "hopper GPUs need driver branch 525 or newer, not 470"),
        ({"gpus": ["kepler"]}, "kepler GPUs are supported up to driver branch 470, not 580"),
        ({"gpus": ["volta"], "branch": "595"}, "volta GPUs are supported up to driver branch 580, not 595"),
        ({"gpus": [], "branch": "470", "kernel_modules": "open"}, "the open kernel modules exist from branch 515 on"),
        ({"kernel_modules": "closed"}, "nvidia_driver_kernel_modules must be one of auto, open, proprietary"),
        ({"branch": "latest"}, "nvidia_driver_branch must be a branch number like '580', got 'latest'"),
        ({"os_version": "18.04"}, "ubuntu-18.04 is not a supported release"),
        (
            {"branch": "570"},
            "driver branch 570 is not a real package set on ubuntu-22.04 (its packages are transitional to 580)",
        ),
        ({"source": "nvidia"}, "nvidia_driver_source 'nvidia' is not available on ubuntu-22.04"),
    ],
)
def test_impossible_combinations_are_refused_with_the_reason(overrides, message):
    errors = plan(settings(**overrides))["errors"]
    assert any(message in error for error in errors), errors


def test_secure_boot_with_dkms_modules_stops_with_the_distributions_own_instructions():
    refused = plan(settings("debian-12", secure_boot="enabled"))
    assert len(refused["errors"]) == 1
    assert "dkms generate_mok, then mokutil --import /var/lib/dkms/mok.pub" in refused["errors"][0]
    assert plan(settings("debian-12", secure_boot="enabled", secure_boot_mok_enrolled=True))["errors"] == []
    ubuntu_dkms = plan(settings("ubuntu-22.04", secure_boot="enabled", prebuilt_modules=False))
    assert "update-secureboot-policy --new-key" in ubuntu_dkms["errors"][0]
    assert "/var/lib/shim-signed/mok/MOK.der" in ubuntu_dkms["errors"][0]
    assert plan(settings("ubuntu-22.04", secure_boot="enabled"))["errors"] == []


def test_unknown_secure_boot_state_is_noted():
    assert plan(settings(secure_boot="unknown"))["notes"] == [
        "Secure Boot state unknown (no EFI variables): assuming it is off"
    ]


@pytest.mark.parametrize(
    ("gpus", "branch", "flavour"),
    [
        ([], "470", "proprietary"),
        ([], "580", "open"),
        (["unknown"], "470", "proprietary"),
        # An unknown GPU on a branch where the open modules are NVIDIA's default (Blackwell needs them).
        ([""], "580", "open"),
    ],
)
def test_hosts_without_a_known_gpu(gpus, branch, flavour):
    result = plan(settings("ubuntu-22.04", gpus=gpus, branch=branch))
    assert result["flavour"] == flavour


@pytest.mark.parametrize(
    ("packages", "kernel", "family", "flavour"),
    [
        (["linux-image-generic", "linux-image-6.8.0-60-generic"], "6.8.0-60-generic", "ubuntu", "generic"),
        (["linux-image-virtual", "linux-image-5.15.0-126-generic"], "5.15.0-126-generic", "ubuntu", "generic"),
        (["linux-image-aws", "linux-image-6.8.0-1024-aws"], "6.8.0-1024-aws", "ubuntu", "aws"),
        (["linux-image-generic-hwe-22.04"], "6.8.0-60-generic", "ubuntu", "generic-hwe-22.04"),
        (["linux-image-amd64", "linux-image-cloud-amd64"], "6.1.0-37-cloud-amd64", "debian", "cloud-amd64"),
        (["linux-image-6.1.0-37-amd64"], "6.1.0-37-amd64", "debian", ""),
        (["linux-image-unsigned-6.8.0-60-generic"], "6.8.0-60-generic", "ubuntu", ""),
    ],
)
def test_kernel_flavour_from_the_installed_metapackage(packages, kernel, family, flavour):
    assert filters.dinops_kernel_flavour(packages, kernel, family) == flavour


def test_newest_kernel_compares_numbers_not_text():
    kernels = ["6.8.0-60-generic", "6.8.0-142-generic", "6.8.0-139-generic", "memtest86+.bin"]
    assert filters.dinops_newest_kernel(kernels) == "6.8.0-142-generic"
    assert filters.dinops_newest_kernel(["6.1.0-9-cloud-amd64", "6.1.0-37-cloud-amd64"]) == "6.1.0-37-cloud-amd64"
    assert filters.dinops_newest_kernel([]) == ""


# `apt-cache show --no-all-versions` stanzas as Ubuntu's archive has them (packages.ubuntu.com, source
# nvidia-graphics-drivers-535-server 535.309.01-0ubuntu0.24.04.2: every binary transitional).
TRANSITIONAL_535 = """Package: nvidia-headless-no-dkms-535-server
Architecture: amd64
Version: 535.309.01-0ubuntu0.24.04.2
Section: restricted/oldlibs
Depends: nvidia-headless-no-dkms-580-server
Description: Transitional package for nvidia-headless-no-dkms-580-server

Package: nvidia-utils-535-server
Architecture: amd64
Version: 535.309.01-0ubuntu0.24.04.2
Section: restricted/oldlibs
Depends: nvidia-utils-580-server
Description: NVIDIA Server Driver support binaries (transitional package)
"""
REAL_580 = """Package: nvidia-headless-no-dkms-580-server-open
Architecture: amd64
Version: 580.173.02-0ubuntu0.24.04.1
Section: restricted/libs
Depends: nvidia-kernel-common-580-server (<= 580.173.02-1), nvidia-kernel-common-580-server (>= 580.173.02)
Description: NVIDIA headless metapackage - no DKMS (open kernel module)

Package: linux-modules-nvidia-575-server-open-generic
Architecture: amd64
Version: 6.8.0-142.142+1
Section: restricted/kernel
Description: Extra drivers for nvidia-575-server-open for the generic flavour (dummy transitional package)
"""


def test_transitional_packages_are_recognised_in_apt_cache_output():
    assert filters.dinops_apt_transitional(TRANSITIONAL_535) == [
        "nvidia-headless-no-dkms-535-server",
        "nvidia-utils-535-server",
    ]
    assert filters.dinops_apt_transitional(REAL_580) == ["linux-modules-nvidia-575-server-open-generic"]
    assert filters.dinops_apt_transitional("") == []


def test_missing_packages_are_found_even_when_apt_cache_exits_0():
    """`apt-cache show A B` exits 0 and says nothing when only B is missing (seen with apt 2.6)."""
    names = ["nvidia-headless-no-dkms-580-server-open", "linux-modules-nvidia-580-server-open-generic"]
    assert filters.dinops_apt_missing(REAL_580, names) == ["linux-modules-nvidia-580-server-open-generic"]
    assert filters.dinops_apt_missing("", names) == names


# apt-cache show of Ubuntu noble's Fabric Manager (packages.ubuntu.com, fabric-manager-580 580.159.03-0ubuntu0.24.04.1).
FABRIC_MANAGER_580 = """Package: nvidia-fabricmanager-580
Architecture: amd64
Version: 580.159.03-0ubuntu0.24.04.1
Depends: libc6 (>= 2.34), nvidia-kernel-common-580-server-580.159.03
Description: Fabric Manager for NVSwitch based systems
"""


def test_fabric_manager_names_the_driver_version_it_needs():
    assert filters.dinops_fabricmanager_version(FABRIC_MANAGER_580, "580") == "580.159.03"
    assert filters.dinops_fabricmanager_version("", "580") == ""
