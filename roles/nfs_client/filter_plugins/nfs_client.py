"""The mounts of the nfs_client role: checked, and with their fstab options assembled.

Sources:
- nfs(5) (fstype nfs with nfsvers=, nconnect "up to a limit of 16"):
  https://manpages.debian.org/bookworm/nfs-common/nfs.5.en.html
- nconnect appeared in Linux 5.3: https://kernelnewbies.org/Linux_5.3 (file systems: NFS, "nconnect")
"""

from __future__ import annotations

import importlib.util
import ipaddress
import posixpath
import re
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# The decision which RPC units an NFSv4-only host masks is nfs_server's, loaded from its file (role filter plugins
# are not importable as a package).
_SERVER_SPEC = importlib.util.spec_from_file_location(
    "dinops_nfs_server_for_client",
    Path(__file__).resolve().parents[2] / "nfs_server" / "filter_plugins" / "nfs_server.py",
)
_server = importlib.util.module_from_spec(_SERVER_SPEC)
_SERVER_SPEC.loader.exec_module(_server)

NFS_VERSIONS = ("4", "4.0", "4.1", "4.2")
NCONNECT_MAX = 16
NCONNECT_MIN_KERNEL = (5, 3)
# A DNS name (RFC 1123 labels); addresses are parsed by ipaddress.
HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
OPTION = re.compile(r"^[A-Za-z0-9_.-]+(=[A-Za-z0-9_.:/@+-]+)?$")


def _kernel_version(kernel: Any) -> tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)", str(kernel or ""))
    if not match:
        raise AnsibleFilterError(f"cannot read the kernel version from ansible_facts.kernel {kernel!r}")
    return int(match.group(1)), int(match.group(2))


def _server_src(server: Any, setting: str) -> str:
    """The server part of fstab's ``server:/path``: IPv6 addresses go in brackets (nfs(5))."""
    if not isinstance(server, str) or not server:
        raise AnsibleFilterError(f"{setting}.server must be the NFS server's host name or address, got {server!r}")
    try:
        address = ipaddress.ip_address(server.strip("[]"))
    except ValueError:
        if not HOST_NAME.match(server):
            raise AnsibleFilterError(f"{setting}.server {server!r} is neither a host name nor an address") from None
        return server
    return f"[{address}]" if address.version == 6 else str(address)


def _path(value: Any, setting: str) -> str:
    if not isinstance(value, str) or not SAFE_PATH.match(value) or posixpath.normpath(value) != value or value == "/":
        raise AnsibleFilterError(
            f"{setting} must be a normalised absolute path other than / without spaces, got {value!r}"
        )
    return value


def default_options(version: Any, options: Any, nconnect: Any) -> list[str]:
    """nfsvers=<version>, the role's options, then nconnect=<n> when n > 1."""
    version = str(version)
    if version not in NFS_VERSIONS:
        raise AnsibleFilterError(f"nfs_client_nfs_version must be one of {', '.join(NFS_VERSIONS)}, got {version!r}")
    if not isinstance(options, (list, tuple)):
        raise AnsibleFilterError(f"nfs_client_mount_options must be a list, got {options!r}")
    try:
        connections = int(nconnect)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"nfs_client_nconnect must be a number, got {nconnect!r}") from None
    if not 1 <= connections <= NCONNECT_MAX:
        raise AnsibleFilterError(f"nfs_client_nconnect must be 1 to {NCONNECT_MAX} (nfs(5)), got {connections}")
    return [f"nfsvers={version}", *options, *([f"nconnect={connections}"] if connections > 1 else [])]


def dinops_nfs_client_mounts(mounts: Any, version: Any, options: Any, nconnect: Any, kernel: Any) -> list[dict]:
    """nfs_client_mounts as ansible.posix.mount arguments: [{src, path, fstype, opts, server}].

    Each mount is {server, remote_path, path}, with optional ``options`` (replace the role's list, nfsvers and
    nconnect included) or ``extra_options`` (appended). nconnect on a kernel older than 5.3 is refused: mount.nfs
    would fail on every boot.
    """
    if not isinstance(mounts, (list, tuple)):
        raise AnsibleFilterError(f"nfs_client_mounts must be a list of {{server, remote_path, path}}, got {mounts!r}")
    role_options = default_options(version, options, nconnect)
    kernel_version = _kernel_version(kernel)
    plan: list[dict] = []
    seen: set[str] = set()
    for index, mount in enumerate(mounts):
        setting = f"nfs_client_mounts[{index}]"
        if not isinstance(mount, dict):
            raise AnsibleFilterError(f"{setting} must be a dict {{server, remote_path, path}}, got {mount!r}")
        unknown = set(mount) - {"server", "remote_path", "path", "options", "extra_options"}
        if unknown:
            raise AnsibleFilterError(
                f"{setting} has unknown keys {sorted(unknown)} (known: server, remote_path, path, options, "
                "extra_options)"
            )
        if "options" in mount and "extra_options" in mount:
            raise AnsibleFilterError(f"{setting}: give options (replaces the role's) or extra_options, not both")
        server = _server_src(mount.get("server"), setting)
        remote = _path(mount.get("remote_path"), f"{setting}.remote_path")
        path = _path(mount.get("path"), f"{setting}.path")
        if path in seen:
            raise AnsibleFilterError(f"{setting}.path {path!r} is mounted twice")
        seen.add(path)
        mount_options = (
            list(mount["options"]) if "options" in mount else [*role_options, *mount.get("extra_options", [])]
        )
        if not mount_options:
            raise AnsibleFilterError(f"{setting}.options must not be empty")
        for option in mount_options:
            if not isinstance(option, str) or not OPTION.match(option):
                raise AnsibleFilterError(f"{setting}: {option!r} is not one mount option (one per list item)")
        keys = [option.partition("=")[0] for option in mount_options]
        for key in set(keys):
            if keys.count(key) > 1:
                raise AnsibleFilterError(f"{setting}: option {key} is given twice")
        if "nconnect" in keys and kernel_version < NCONNECT_MIN_KERNEL:
            raise AnsibleFilterError(
                f"{setting}: nconnect needs Linux 5.3 or newer and this host runs {kernel}; set nfs_client_nconnect: 1"
            )
        plan.append(
            {
                "server": mount["server"].strip("[]"),
                "src": f"{server}:{remote}",
                "path": path,
                "fstype": "nfs",
                "opts": ",".join(mount_options),
            }
        )
    return plan


def dinops_nfs_client_versions(mounts: Any, version: Any) -> list[str]:
    """Every NFS version this host mounts: the role's nfsvers and each assembled mount's own nfsvers= or vers=
    (nfs(5)), in order, once each; nfs_server's dinops_nfs_rpc_units decides from them."""
    found = [str(version)]
    for mount in mounts or []:
        for option in mount.get("options") or []:
            key, _, value = str(option).partition("=")
            if key in ("nfsvers", "vers") and value and value not in found:
                found.append(value)
    return found


class FilterModule:
    """nfs_client filters."""

    def filters(self):
        return {
            "dinops_nfs_client_mounts": dinops_nfs_client_mounts,
            "dinops_nfs_client_versions": dinops_nfs_client_versions,
            "dinops_nfs_client_rpc_units": _server.dinops_nfs_rpc_units,
        }
