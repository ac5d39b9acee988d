"""The toolkit's GPU-only decisions: the loaded driver's version, the /dev/char links nvidia-ctk added, the CDI spec.

Inputs are what a GPU host shows: /proc/driver/nvidia/version of the open and the proprietary modules, the listing
the role's dev-char task prints (find -printf '%f %l'), and CDI specifications in the form nvidia-ctk v1.17 writes
(cmd/nvidia-ctk/cdi/generate's expected specs: devices "0" and "all", common containerEdits with the versioned
driver libraries and nvidia-cdi-hook hooks).
"""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from dinops_testing import load_plugin

plugin = load_plugin("roles/nvidia_container_toolkit/filter_plugins/nvidia_ctk.py")
driver_version = plugin.dinops_nvidia_driver_version
links_added = plugin.dinops_nvidia_dev_char_links_added
cdi_plan = plugin.dinops_nvidia_cdi_spec_plan

BANNER_OPEN_580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
    "  (dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:01:43 UTC 2025\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)
BANNER_PROPRIETARY_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)

# /dev/char links to NVIDIA nodes on a one-GPU host before nvidia-ctk first ran (udev links only for the nodes it
# created itself; nvidia-modprobe's mknod nodes have none) and after it (absolute targets, as CreateLinks writes).
NVIDIA_CTK_LINKS = [
    "195:254 /dev/nvidia-modeset",
    "195:255 /dev/nvidiactl",
    "508:0 /dev/nvidia-uvm",
    "508:1 /dev/nvidia-uvm-tools",
    "195:0 /dev/nvidia0",
]


def listing(before, after):
    return "\n".join([*before, "--", *after]) + "\n"


@pytest.mark.parametrize(
    ("banner", "version"),
    [(BANNER_OPEN_580, "580.95.05"), (BANNER_PROPRIETARY_535, "535.183.01")],
)
def test_driver_version_from_both_banners(banner, version):
    assert driver_version(banner) == version


@pytest.mark.parametrize("banner", ["", "GCC version:  gcc version 12.3.0\n", None])
def test_a_banner_without_a_version_is_an_error(banner):
    with pytest.raises(AnsibleFilterError, match="cannot read the driver version"):
        driver_version(banner)


def test_first_run_reports_every_link_it_created():
    assert links_added(listing([], NVIDIA_CTK_LINKS)) == [
        "195:0 -> /dev/nvidia0",
        "195:254 -> /dev/nvidia-modeset",
        "195:255 -> /dev/nvidiactl",
        "508:0 -> /dev/nvidia-uvm",
        "508:1 -> /dev/nvidia-uvm-tools",
    ]


def test_second_run_creates_nothing_although_nvidia_ctk_logs_creating_link_again():
    assert links_added(listing(NVIDIA_CTK_LINKS, NVIDIA_CTK_LINKS)) == []


def test_relative_udev_links_and_other_devices_count_as_present():
    before = ["195:0 ../nvidia0", "195:255 ../nvidiactl", "226:0 ../dri/card0"]
    after = [*before, "508:0 /dev/nvidia-uvm"]
    assert links_added(listing(before, after)) == ["508:0 -> /dev/nvidia-uvm"]


def test_mig_capability_links_are_nvidia_links():
    after = [*NVIDIA_CTK_LINKS, "237:1 /dev/nvidia-caps/nvidia-cap1"]
    assert links_added(listing(NVIDIA_CTK_LINKS, after)) == ["237:1 -> /dev/nvidia-caps/nvidia-cap1"]


def test_a_listing_without_the_separator_is_a_programming_error():
    with pytest.raises(AnsibleFilterError, match="separated by a line '--'"):
        links_added("\n".join(NVIDIA_CTK_LINKS))


def cdi_spec(version, devices=("0", "all")):
    """A CDI specification in the form `nvidia-ctk cdi generate` v1.17 writes for one GPU."""
    device_blocks = "".join(
        f"""- name: "{name}"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
"""
        for name in devices
    )
    return f"""---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
{device_blocks}containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{version}
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{version}
    options: [ro, nosuid, nodev, bind]
  - hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}
    containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}
    options: [ro, nosuid, nodev, bind]
  - hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1.1.13
    containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1.1.13
    options: [ro, nosuid, nodev, bind]
  - hostPath: /usr/bin/nvidia-smi
    containerPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
"""


def test_a_spec_for_the_loaded_driver_is_kept():
    plan = cdi_plan(cdi_spec("580.95.05"), BANNER_OPEN_580)
    assert plan == {
        "generate": False,
        "reason": "the CDI specification matches the loaded driver 580.95.05",
        "driver_version": "580.95.05",
        "spec_driver_versions": ["580.95.05"],
    }


def test_a_spec_for_the_previous_driver_is_regenerated():
    plan = cdi_plan(cdi_spec("535.183.01"), BANNER_OPEN_580)
    assert plan["generate"] is True
    assert plan["reason"] == "the CDI specification was written for driver 535.183.01, 580.95.05 is loaded"
    assert plan["spec_driver_versions"] == ["535.183.01"]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("", "no CDI specification yet"),
        (cdi_spec("580.95.05", devices=("0",)), "the CDI specification has no 'all' device"),
        (cdi_spec("580.95.05").replace("libcuda.so.580.95.05", "libcuda.so.1"), "mounts no libcuda.so.<version>"),
        ("cdiVersion: [0.5.0\n", "cannot be parsed"),
        ("- a list\n", "is not a mapping"),
    ],
)
def test_a_missing_partial_or_unreadable_spec_is_regenerated(spec, reason):
    plan = cdi_plan(spec, BANNER_PROPRIETARY_535)
    assert plan["generate"] is True
    assert reason in plan["reason"]


def test_device_level_mounts_count_too():
    spec = cdi_spec("535.183.01").replace(
        '- name: "all"\n  containerEdits:\n',
        '- name: "all"\n  containerEdits:\n    mounts:\n    - hostPath: /usr/lib64/libcuda.so.580.95.05\n',
    )
    assert cdi_plan(spec, BANNER_PROPRIETARY_535)["spec_driver_versions"] == ["535.183.01", "580.95.05"]
    assert cdi_plan(spec, BANNER_PROPRIETARY_535)["generate"] is True


def test_cdi_plan_needs_a_readable_banner():
    with pytest.raises(AnsibleFilterError, match="cannot read the driver version"):
        cdi_plan(cdi_spec("580.95.05"), "")
