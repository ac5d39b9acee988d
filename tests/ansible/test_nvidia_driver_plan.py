"""Driver selection for every supported release and GPU generation (Ubuntu cannot be built in CI).

The facts come from the compatibility contract (facts/nvidia.yml); tests/ansible/test_ubuntu_archive.py runs the
package sets through real apt against Ubuntu's dependency graph.
"""

from __future__ import annotations

import pytest
import yaml

from dinops_testing import REPO, driver_plan_settings, load_plugin

filters = load_plugin("roles/nvidia_driver/filter_plugins/nvidia_driver_plan.py")
manager = load_plugin("roles/nvidia_driver/filter_plugins/fabric_manager.py")
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
    assert manager.dinops_fabricmanager_version(FABRIC_MANAGER_580, "580") == "580.159.03"
    assert manager.dinops_fabricmanager_version("", "580") == ""


# --- NVSwitch fabric (finding F4 of the second hosts audit) -----------------------------------------------------------
# `nvidia-smi -q` prints a "Fabric" block per GPU. Hopper and newer report their NVSwitch fabric registration ("In
# Progress" after Fabric Manager starts, then "Completed"); NVML's fabric query is "for Hopper or newer fully supported
# devices" (nvmlDeviceGetGpuFabricInfo*, https://docs.nvidia.com/deploy/nvml-api/). Ampere HGX prints N/A with Fabric
# Manager running and CUDA working: bottlerocket-os/bottlerocket#3873, tested on p4d.24xlarge, "`nvidia-smi -q | grep
# -A 2 'Fabric'` command shows as `State: N/A, Status: N/A` even though fabric manager is running successfully".
def smi_q(states):
    """`nvidia-smi -q` for GPUs whose fabric state is ``states`` (None: a driver that prints no Fabric block)."""
    out = "==============NVSMI LOG==============\n\nDriver Version                            : 580.159.03\n\n"
    for index, state in enumerate(states):
        out += f"GPU 00000000:{16 + index:02X}:1C.0\n    Product Name                          : NVIDIA GPU\n"
        if state is not None:
            status = "Success" if state == "Completed" else "N/A"
            out += f"    Fabric\n        State                             : {state}\n"
            out += f"        Status                            : {status}\n"
        out += "    Persistence Mode                      : Enabled\n\n"
    return out


def check_task(name_part):
    tasks = yaml.safe_load((REPO / "roles/nvidia_driver/tasks/check.yml").read_text())
    found = [task for task in tasks if name_part in task["name"]]
    assert len(found) == 1, [task["name"] for task in tasks]
    return found[0]


def templar(variables):
    """Ansible's templating with the role's filters, as the role's tasks see it."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import filter_loader
    from ansible.template import Templar

    filter_loader.add_directory(str(REPO / "roles/nvidia_driver/filter_plugins"))
    return Templar(loader=DataLoader(), variables=variables)


def evaluate(condition, variables):
    """A task's condition (until, that, when) evaluated by Ansible."""
    from ansible.template import trust_as_template

    return templar(variables).evaluate_conditional(trust_as_template(condition))


def fabric_ready(generation, states):
    """What check.yml's wait says about an 8-GPU NVSwitch host of this generation whose GPUs print these states."""
    task = check_task("Wait for the NVSwitch fabric")
    the_plan = plan(settings("ubuntu-24.04", gpus=[generation] * len(states), nvswitch_count=6))
    variables = {
        "__nvidia_driver_plan": the_plan,
        "__nvidia_driver_gpu_count": len(states),
        "__nvidia_driver_nvswitch_count": 6,
        task["register"]: {"rc": 0, "stdout": smi_q(states), "stdout_lines": smi_q(states).splitlines()},
    }
    return evaluate(task["until"], variables)


@pytest.mark.parametrize(
    ("generation", "states", "ready"),
    [
        ("hopper", ["Completed"] * 8, True),
        ("hopper", ["Completed"] * 7 + ["In Progress"], False),
        ("hopper", ["N/A"] * 8, False),  # a Hopper that does not report it: Fabric Manager never registered it
        ("blackwell", ["Completed"] * 8, True),
        ("ampere", ["N/A"] * 8, True),  # p4d.24xlarge with Fabric Manager running (bottlerocket#3873)
        ("ampere", [None] * 8, True),  # a driver that prints no Fabric block at all
        ("ampere", ["N/A"] * 7 + ["In Progress"], False),
    ],
    ids=["h100-done", "h100-training", "h100-na", "b200-done", "a100-na", "a100-no-block", "a100-in-progress"],
)
def test_fabric_wait_expects_completed_only_where_the_gpu_reports_it(generation, states, ready):
    assert fabric_ready(generation, states) is ready


@pytest.mark.parametrize(
    ("gpus", "nvswitch_count", "fabric"),
    [
        (["hopper"] * 8, 4, {"completed": 8, "not_reported": 0}),
        (["blackwell"] * 8, 4, {"completed": 8, "not_reported": 0}),
        (["ampere"] * 8, 6, {"completed": 0, "not_reported": 8}),
        (["volta"] * 8, 6, {"completed": 0, "not_reported": 8}),
        # An unknown generation may or may not report the state: Completed or N/A are both accepted, and the service
        # must be active.
        (["unknown"] * 2, 6, {"completed": 0, "not_reported": 2}),
        (["hopper"] * 8, 0, {"completed": 0, "not_reported": 0}),
    ],
)
def test_plan_says_which_gpus_report_the_fabric_state(gpus, nvswitch_count, fabric):
    the_plan = plan(settings("ubuntu-24.04", gpus=gpus, nvswitch_count=nvswitch_count))
    assert the_plan["fabric"] == fabric


@pytest.mark.parametrize(("state", "passes"), [("running", True), ("stopped", False), ("failed", False), (None, False)])
def test_fabric_manager_must_be_active_on_every_nvswitch_host(state, passes):
    """Without a fabric state to read (Ampere), the service is what says Fabric Manager works. (None: no such unit.)"""
    task = check_task("Check Fabric Manager is running")
    assert "ansible.builtin.assert" in task
    unit = {"name": "nvidia-fabricmanager.service", "state": state}
    services = {"nvidia-fabricmanager.service": unit} if state else {}
    variables = {"ansible_facts": {"services": services}}
    assert all(evaluate(condition, variables) for condition in task["ansible.builtin.assert"]["that"]) is passes


# --- Fabric Manager against Canonical's prebuilt module (finding F5 of the second hosts audit) ------------------------
# apt-cache show of the flavour metapackage whose module was built with driver 580.173.02 (the metapackage carries
# `nvidia-kernel-common-<B>-server (>= U)` for its build version U; the module package it depends on carries both
# bounds, `(<= U-1)` and `(>= U)`: ../shared/facts/ubuntu-nvidia-packaging.md §4).
LRM_META_173 = """Package: linux-modules-nvidia-580-server-open-generic
Architecture: amd64
Version: 6.8.0-142.142+1
Section: restricted/kernel
Depends: linux-modules-nvidia-580-server-open-6.8.0-142-generic (= 6.8.0-142.142+1), nvidia-kernel-common-580-server (>= 580.173.02)
Description: Extra drivers for nvidia-580-server-open for the generic flavour
"""  # noqa: E501
LRM_ABI_159 = """Package: linux-modules-nvidia-580-server-open-6.8.0-139-generic
Architecture: amd64
Version: 6.8.0-139.139
Depends: debconf (>= 0.5) | debconf-2.0, linux-image-6.8.0-139-generic | linux-image-unsigned-6.8.0-139-generic, nvidia-kernel-common-580-server (<= 580.159.03-1), nvidia-kernel-common-580-server (>= 580.159.03)
Description: Linux kernel nvidia modules for version 6.8.0-139
"""  # noqa: E501
FM_PIN_159 = {"packages": ["nvidia-*", "libnvidia-*"], "version": "580.159.03-*"}


def nvswitch_plan(**overrides):
    """A p5.48xlarge-like host on the generic kernel 6.8.0-142 (the LRM samples above)."""
    host = {"kernel": "6.8.0-142-generic", "kernel_flavour": "generic", **overrides}
    return plan(settings("ubuntu-24.04", gpus=["hopper"], nvswitch_count=4, **host))


def test_fabric_manager_behind_the_prebuilt_module_stops_and_says_what_to_do():
    result = manager.dinops_fabricmanager_pin(nvswitch_plan(), FABRIC_MANAGER_580, LRM_META_173)
    assert (result["version"], result["modules_version"]) == ("580.159.03", "580.173.02")
    assert len(result["errors"]) == 1
    error = result["errors"][0]
    for part in (
        "nvidia-fabricmanager-580 580.159.03-0ubuntu0.24.04.1 needs the driver at 580.159.03",
        "linux-modules-nvidia-580-server-open-generic 6.8.0-142.142+1 was built for driver 580.173.02",
        "nvidia_driver_prebuilt_modules: false",
        "DKMS",
    ):
        assert part in error, error


def test_fabric_manager_at_the_prebuilt_modules_version_pins_the_driver_to_it():
    # No kernel metapackage installed: the running kernel's module package, named by its ABI.
    the_plan = nvswitch_plan(kernel="6.8.0-139-generic", kernel_flavour="")
    assert the_plan["modules_package"] == "linux-modules-nvidia-580-server-open-6.8.0-139-generic"
    result = manager.dinops_fabricmanager_pin(the_plan, FABRIC_MANAGER_580, LRM_ABI_159)
    assert (result["pin"], result["errors"]) == (FM_PIN_159, [])


def test_with_dkms_fabric_managers_version_is_pinned_whatever_the_prebuilt_modules_say():
    the_plan = nvswitch_plan(prebuilt_modules=False)
    assert the_plan["modules_package"] == ""
    assert the_plan["packages"] == [
        "nvidia-headless-580-server-open",
        "nvidia-utils-580-server",
        "libnvidia-compute-580-server",
        "linux-headers-generic",
        "nvidia-fabricmanager-580",
    ]
    result = manager.dinops_fabricmanager_pin(the_plan, FABRIC_MANAGER_580, "")
    assert (result["pin"], result["errors"]) == (FM_PIN_159, [])


def test_the_newest_fabric_manager_is_taken_whatever_an_earlier_pin_made_the_candidate():
    """`apt-cache show` without --no-all-versions lists every version, newest first: the role's own pin of an earlier
    run (the driver and Fabric Manager at 580.159.03) must not hide a newer Fabric Manager."""
    newer = FABRIC_MANAGER_580.replace("580.159.03", "580.173.02")
    result = manager.dinops_fabricmanager_pin(nvswitch_plan(), newer + "\n" + FABRIC_MANAGER_580, LRM_META_173)
    assert (result["pin"]["version"], result["errors"]) == ("580.173.02-*", [])


def test_hosts_without_nvswitch_keep_the_plans_own_pin():
    assert manager.dinops_fabricmanager_pin(plan(settings("ubuntu-24.04")), "", "") == {
        "version": "",
        "modules_version": "",
        "pin": {},
        "errors": [],
    }
    debian = plan(settings("debian-12", nvswitch_count=4))
    assert manager.dinops_fabricmanager_pin(debian, "", "")["pin"] == debian["pin"]


@pytest.mark.parametrize(
    ("prebuilt", "stale"),
    [
        # DKMS now: the prebuilt modules of this branch go (they bind userspace to their own build version).
        (False, ["linux-modules-nvidia-580-server-open-6.8.0-142-generic", "linux-modules-nvidia-580-server-open-aws",
                 "linux-objects-nvidia-580-server-open-6.8.0-142-generic"]),
        # Prebuilt again: the DKMS module package and the headless metapackage that pulls it go.
        (True, ["nvidia-dkms-580-server-open", "nvidia-headless-580-server-open"]),
    ],
)  # fmt: skip
def test_switching_between_prebuilt_and_dkms_modules_removes_the_other_kind(prebuilt, stale):
    installed = [
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-headless-580-server-open",
        "nvidia-dkms-580-server-open",
        "linux-modules-nvidia-580-server-open-aws",
        "linux-modules-nvidia-580-server-open-6.8.0-142-generic",
        "linux-objects-nvidia-580-server-open-6.8.0-142-generic",
        "linux-signatures-nvidia-6.8.0-142-generic",
        "nvidia-kernel-source-580-server-open",
    ]
    the_plan = plan(settings("ubuntu-24.04", gpus=["hopper"], prebuilt_modules=prebuilt, installed=installed))
    assert the_plan["remove"] == stale


def test_pin_tasks_feed_apt_caches_answers_to_the_decision_and_stop_on_its_error():
    from ansible.template import trust_as_template

    tasks = yaml.safe_load((REPO / "roles/nvidia_driver/tasks/pin.yml").read_text())
    decide = next(task for task in tasks if "ansible.builtin.set_fact" in task)["ansible.builtin.set_fact"]
    stop = next(task for task in tasks if "ansible.builtin.fail" in task)
    lock = next(task for task in tasks if "ansible.builtin.template" in task)

    def decision(modules):
        variables = {
            "__nvidia_driver_plan": nvswitch_plan(),
            "__nvidia_driver_fabricmanager_result": {"rc": 0, "stdout": FABRIC_MANAGER_580},
            "__nvidia_driver_modules_result": {"rc": 0, "stdout": modules},
        }
        result = templar(variables).template(trust_as_template(decide["__nvidia_driver_pin_plan"]))
        return {"__nvidia_driver_pin_plan": result}

    assert evaluate(stop["when"], decision(LRM_META_173))
    matching = decision(LRM_META_173.replace("580.173.02", "580.159.03"))
    assert not evaluate(stop["when"], matching)
    assert evaluate(lock["when"], matching)
    assert matching["__nvidia_driver_pin_plan"]["pin"] == FM_PIN_159
