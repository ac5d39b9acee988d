"""Fabric Manager on NVSwitch hosts: which driver version to pin, and when the NVSwitch fabric is ready.

Pure functions of apt-cache's and nvidia-smi's output, tested in tests/ansible/test_nvidia_driver_plan.py and, with
real apt against Ubuntu's dependency graph, in tests/ansible/test_ubuntu_archive.py.

``dinops_fabricmanager_pin``: Ubuntu's ``nvidia-fabricmanager-<B>`` depends on one exact driver version (the virtual
``nvidia-kernel-common-<B>-server-<U>``) and lags the driver's uploads (noble: 580.159.03 against a 580.173.02
driver), so the driver is pinned to Fabric Manager's version (../shared/facts/ubuntu-nvidia-packaging.md §5, §6.4).
Canonical's prebuilt module packages are bound to the driver they were built with from both sides,
``nvidia-kernel-common-<B>-server (<= U-1)`` and ``(>= U)`` (real stanza linux-modules-nvidia-515-server-5.15.0-56-
generic, NVIDIA/cloud-native-docs@5853d9b1d616e39d81ecfe3f211cb2038ade846e:gpu-operator/install-precompiled-signed-
drivers.rst lines 51-68, quoted in facts §4; the flavour metapackage carries ``(>= U)``, its build version). When the
two versions differ no driver satisfies both: apt stops with unmet dependencies, after the role has already removed
the packages of another branch. So the role stops before touching a package and says what to do. It does not switch
the host to DKMS by itself: that would trade Canonical's signed modules for a module built on the host (which does not
load under Secure Boot until a key is enrolled), put a compiler on it, and switch back and forth as the archive's
uploads move. ``nvidia_driver_prebuilt_modules: false`` makes that switch on purpose, and the plan then removes the
prebuilt module packages.

``dinops_fabric_waiting``: Hopper and newer report their NVSwitch fabric registration in ``nvidia-smi -q`` ("In
Progress", then "Completed"); older GPUs print N/A with Fabric Manager running and CUDA working (NVML
nvmlDeviceGetGpuFabricInfo*: "For Hopper or newer fully supported devices", https://docs.nvidia.com/deploy/nvml-api/;
bottlerocket-os/bottlerocket#3873 on p4d.24xlarge: "State: N/A, Status: N/A even though fabric manager is running
successfully"). The plan's ``fabric`` counts both kinds from the GPU generations (facts/nvidia.yml).
"""

from __future__ import annotations

import re
from collections import Counter

# NVIDIA's driver package names (apt_preferences(5) globs) pinned to Fabric Manager's version on Ubuntu.
UBUNTU_DRIVER_PACKAGES = ["nvidia-*", "libnvidia-*"]
# `nvidia-smi -q`: "    Fabric\n        State        : Completed" per GPU (no block at all from older drivers).
FABRIC_STATE = re.compile(r"^[ \t]*Fabric[ \t]*\n[ \t]*State[ \t]*:[ \t]*(.*?)[ \t]*$", re.M)
# What a GPU without fabric state reporting prints (NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, or no NVML support at all).
NOT_REPORTED = ("N/A", "Not Supported")


def _stanza(stanzas, package):
    """The first ``apt-cache show`` stanza of ``package`` (apt lists a package's versions newest first)."""
    for stanza in re.split(r"\n\s*\n", stanzas or ""):
        if package and re.search(rf"^Package:\s*{re.escape(package)}\s*$", stanza, re.M):
            return stanza
    return ""


def _field(stanza, name):
    found = re.search(rf"^{name}:\s*(\S+)", stanza, re.M)
    return found.group(1) if found else ""


def dinops_fabricmanager_version(stanzas, branch):
    """The driver version (upstream, e.g. '580.159.03') that the newest ``nvidia-fabricmanager-<branch>`` in
    ``apt-cache show`` output requires: it depends on the exact virtual ``nvidia-kernel-common-<branch>-server-<U>``.
    '' when it names none."""
    stanza = _stanza(stanzas, f"nvidia-fabricmanager-{branch}")
    found = re.findall(rf"nvidia-kernel-common-{branch}-server-([0-9][0-9.]*[0-9])", stanza)
    return found[0] if found else ""


def _built_for(stanza, branch):
    """The driver version a prebuilt module package was built for: its ``nvidia-kernel-common-<B>-server (>= U)``."""
    found = re.findall(rf"nvidia-kernel-common-{branch}-server \(>=\s*([0-9][0-9.]*[0-9])\)", stanza)
    return found[0] if found else ""


def dinops_fabricmanager_pin(plan, fabricmanager, modules):
    """The apt pin for this host and whether it can work.

    ``plan``: dinops_nvidia_driver_plan's result; ``fabricmanager``: ``apt-cache show nvidia-fabricmanager-<B>``
    (every version: the role's own pin of an earlier run makes an old version the candidate); ``modules``: ``apt-cache
    show --no-all-versions <plan's modules_package>`` ('' with DKMS). Returns version (Fabric Manager's driver
    version, '' when not an Ubuntu NVSwitch host or none named), modules_version (the prebuilt module's build
    version), pin (what templates/apt-preferences.j2 writes; the plan's own pin when Fabric Manager names none) and
    errors (the role stops when not empty).
    """
    result = {"version": "", "modules_version": "", "pin": plan.get("pin") or {}, "errors": []}
    if plan.get("family") != "ubuntu" or not plan.get("services"):
        return result
    branch = plan["branch"]
    manager = f"nvidia-fabricmanager-{branch}"
    version = dinops_fabricmanager_version(fabricmanager, branch)
    if not version:
        return result
    result["version"] = version
    result["pin"] = {"packages": UBUNTU_DRIVER_PACKAGES, "version": f"{version}-*"}
    module = plan.get("modules_package") or ""
    module_stanza = _stanza(modules, module)
    built = _built_for(module_stanza, branch)
    result["modules_version"] = built
    if built and built != version:
        later = (
            f"Ubuntu publishes {manager} {built}"
            if [int(n) for n in built.split(".")] > [int(n) for n in version.split(".")]
            else f"Canonical publishes {module} built for driver {version}"
        )
        result["errors"].append(
            f"Fabric Manager and Canonical's prebuilt kernel module need different driver versions:"
            f" {manager} {_field(_stanza(fabricmanager, manager), 'Version')} needs the driver at {version} exactly,"
            f" but {module} {_field(module_stanza, 'Version')} was built for driver {built} and accepts no other, so"
            f" apt cannot install them together. Either set nvidia_driver_prebuilt_modules: false for this host (the"
            f" module is then built by DKMS against the kernel headers at driver {version}; with Secure Boot on, enroll"
            f" the DKMS signing key first, see nvidia_driver_secure_boot_mok_enrolled), or run again once {later}."
        )
    return result


def dinops_fabric_waiting(smi_output, fabric):
    """What the NVSwitch fabric is still waiting for, from ``nvidia-smi -q``; [] when it is ready.

    ``fabric``: the plan's {completed: GPUs that must report Completed (Hopper and newer), not_reported: GPUs that
    print N/A}. A state other than Completed or N/A (In Progress, Not Started) on any GPU is waited for."""
    states = FABRIC_STATE.findall(smi_output or "")
    waiting = []
    completed = states.count("Completed")
    if completed < int(fabric.get("completed", 0)):
        waiting.append(f"{completed} of {fabric['completed']} Hopper-or-newer GPUs report the fabric Completed")
    pending = Counter(state for state in states if state != "Completed" and state not in NOT_REPORTED)
    waiting += [f"fabric state {state!r} on {count} GPU(s)" for state, count in sorted(pending.items())]
    return waiting


class FilterModule:
    """Fabric Manager's pin and the NVSwitch fabric's readiness."""

    def filters(self):
        return {
            "dinops_fabricmanager_pin": dinops_fabricmanager_pin,
            "dinops_fabric_waiting": dinops_fabric_waiting,
        }
