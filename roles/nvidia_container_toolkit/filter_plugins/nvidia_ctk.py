"""Decisions of the toolkit's GPU-only steps, as pure functions (a GPU host cannot be built in CI).

Tested with pytest in tests/ansible/test_nvidia_container_toolkit_devices.py, on real driver banners, the listing
the role's dev-char task prints and CDI specifications in the form nvidia-ctk writes.

- ``dinops_nvidia_driver_version``: the version in /proc/driver/nvidia/version. The file exists only while the
  kernel module is loaded; both banners (open and proprietary modules) name the version after "Kernel Module".
- ``dinops_nvidia_dev_char_links_added``: which /dev/char links to NVIDIA nodes the nvidia-ctk run created.
  nvidia-ctk v1.17.8 logs "Creating link <link> => <node>" for every node, existing or not, and only warns when
  os.Symlink fails because the link exists (cmd/nvidia-ctk/system/create-dev-char-symlinks/
  create-dev-char-symlinks.go, CreateLinks), so its output cannot tell; the links before and after can.
- ``dinops_nvidia_cdi_spec_plan``: whether /etc/cdi/nvidia.yaml must be (re)generated. ``nvidia-ctk cdi generate``
  (v1.17.8) mounts the driver's libraries by their versioned names, found as ``libcuda.so.<driver version>`` and
  ``*.so.<driver version>`` (pkg/nvcdi/driver-nvml.go, getVersionLibs), so a spec written for another driver
  mounts files that no longer exist.
"""

from __future__ import annotations

import posixpath
import re

import yaml
from ansible.errors import AnsibleFilterError

# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ..." (open modules) and
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 ..." (proprietary).
_BANNER_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
# The library every spec mounts (getVersionLibs fails without it), by its versioned file name.
_LIBCUDA = re.compile(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")
# The line the role's dev-char task prints between the listing before and the listing after nvidia-ctk.
DEV_CHAR_SEPARATOR = "--"
DEV_CHAR_DIR = "/dev/char"
CDI_ALL_DEVICE = "all"


def dinops_nvidia_driver_version(banner):
    """Return the driver version in the text of /proc/driver/nvidia/version; fail on a banner of unknown form."""
    match = _BANNER_VERSION.search(str(banner or ""))
    if not match:
        first_line = str(banner or "").strip().splitlines()[:1]
        raise AnsibleFilterError(
            f"cannot read the driver version from /proc/driver/nvidia/version ({first_line or 'empty'}):"
            " expected 'NVRM version: NVIDIA UNIX ... Kernel Module <version> ...'"
        )
    return match.group(1)


def _nvidia_links(lines):
    """Map link name -> target for the listed /dev/char links whose target is an NVIDIA device node."""
    links = {}
    for line in lines:
        name, _, target = line.strip().partition(" ")
        if not name or not target:
            continue
        node = posixpath.normpath(posixpath.join(DEV_CHAR_DIR, target))
        if posixpath.basename(node).startswith("nvidia") and node.startswith("/dev/"):
            links[name] = node
    return links


def dinops_nvidia_dev_char_links_added(listing):
    """Return the links ("<major>:<minor> -> <node>") in the listing after nvidia-ctk that were not there before.

    ``listing`` is the task's stdout: ``find /dev/char -type l -printf '%f %l\\n'`` before the run, a line
    ``--``, and the same listing after the run. Targets may be absolute (nvidia-ctk: /dev/nvidia0) or relative
    (udev: ../nvidia0).
    """
    lines = str(listing or "").splitlines()
    if DEV_CHAR_SEPARATOR not in (line.strip() for line in lines):
        raise AnsibleFilterError(
            f"dinops_nvidia_dev_char_links_added expects the listing before and after nvidia-ctk separated by a"
            f" line {DEV_CHAR_SEPARATOR!r}, got: {listing!r}"
        )
    cut = [line.strip() for line in lines].index(DEV_CHAR_SEPARATOR)
    before = _nvidia_links(lines[:cut])
    after = _nvidia_links(lines[cut + 1 :])
    return [f"{name} -> {node}" for name, node in sorted(after.items()) if name not in before]


def _spec_mounts(spec):
    """Yield every mount's hostPath, from the common edits and from each device's edits."""
    edits = [spec.get("containerEdits") or {}]
    edits += [(device or {}).get("containerEdits") or {} for device in spec.get("devices") or []]
    for edit in edits:
        for mount in edit.get("mounts") or []:
            if isinstance(mount, dict) and mount.get("hostPath"):
                yield str(mount["hostPath"])


def dinops_nvidia_cdi_spec_plan(spec_text, banner):
    """Decide whether the CDI specification matches the loaded driver.

    ``spec_text``: the current specification ('' when the file is missing); ``banner``: the text of
    /proc/driver/nvidia/version. Returns ``{generate, reason, driver_version, spec_driver_versions}``.
    """
    driver_version = dinops_nvidia_driver_version(banner)

    def plan(generate, reason, spec_versions=()):
        return {
            "generate": generate,
            "reason": reason,
            "driver_version": driver_version,
            "spec_driver_versions": sorted(spec_versions),
        }

    if not str(spec_text or "").strip():
        return plan(True, "no CDI specification yet")
    try:
        spec = yaml.safe_load(spec_text)
    except yaml.YAMLError as exc:
        return plan(True, f"the CDI specification cannot be parsed ({exc.__class__.__name__}); nvidia-ctk rewrites it")
    if not isinstance(spec, dict):
        return plan(True, "the CDI specification is not a mapping; nvidia-ctk rewrites it")
    names = {str((device or {}).get("name")) for device in spec.get("devices") or []}
    versions = set()
    for host_path in _spec_mounts(spec):
        match = _LIBCUDA.match(posixpath.basename(host_path))
        if match:
            versions.add(match.group(1))
    if CDI_ALL_DEVICE not in names:
        return plan(True, f"the CDI specification has no '{CDI_ALL_DEVICE}' device", versions)
    if not versions:
        return plan(True, "the CDI specification mounts no libcuda.so.<version>", versions)
    if versions != {driver_version}:
        found = ", ".join(sorted(versions))
        return plan(True, f"the CDI specification was written for driver {found}, {driver_version} is loaded", versions)
    return plan(False, f"the CDI specification matches the loaded driver {driver_version}", versions)


class FilterModule:
    """Filters for the toolkit's GPU-only steps."""

    def filters(self):
        return {
            "dinops_nvidia_driver_version": dinops_nvidia_driver_version,
            "dinops_nvidia_dev_char_links_added": dinops_nvidia_dev_char_links_added,
            "dinops_nvidia_cdi_spec_plan": dinops_nvidia_cdi_spec_plan,
        }
