"""Decisions of the nfs_server role: the export lines (with the safety rules), the firewall sources and whether the
data disk may be formatted.

Sources (Debian 12's nfs-utils 2.6.2 and util-linux 2.38 man pages; Ubuntu 22.04/24.04 ship the same options):
- exports(5), options and client forms: https://manpages.debian.org/bookworm/nfs-kernel-server/exports.5.en.html
- blkid(8), exit status 0 (found), 2 (nothing found), 8 (ambivalent, -p only):
  https://manpages.debian.org/bookworm/util-linux/blkid.8.en.html
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Any

from ansible.errors import AnsibleFilterError

# exports(5) "General Options" and "User ID Mapping": flags, and the options that take a value.
EXPORT_FLAGS = frozenset(
    {
        "secure",
        "insecure",
        "rw",
        "ro",
        "async",
        "sync",
        "no_wdelay",
        "wdelay",
        "nohide",
        "hide",
        "crossmnt",
        "nocrossmnt",
        "no_subtree_check",
        "subtree_check",
        "insecure_locks",
        "no_auth_nlm",
        "secure_locks",
        "auth_nlm",
        "mountpoint",
        "mp",
        "nordirplus",
        "pnfs",
        "no_pnfs",
        "security_label",
        "root_squash",
        "no_root_squash",
        "all_squash",
        "no_all_squash",
    }
)
EXPORT_VALUED = frozenset({"mountpoint", "mp", "fsid", "refer", "replicas", "sec", "anonuid", "anongid"})
# Options that contradict each other: an export carries at most one of each pair.
EXPORT_CONFLICTS = (
    ("rw", "ro"),
    ("sync", "async"),
    ("root_squash", "no_root_squash"),
    ("all_squash", "no_all_squash"),
    ("secure", "insecure"),
    ("subtree_check", "no_subtree_check"),
    ("hide", "nohide"),
    ("crossmnt", "nocrossmnt"),
    ("wdelay", "no_wdelay"),
)
# A host name, a wildcard pattern (exports(5) "wildcards") or an @netgroup; addresses are parsed by ipaddress.
HOST_PATTERN = re.compile(r"^@?[A-Za-z0-9*?\[\]][A-Za-z0-9*?\[\]._-]*$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
# nfs_server_data_fstype's choices (meta/argument_specs.yml).
SUPPORTED_FSTYPES = ("ext4", "xfs")


def _network(client: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The client as an address or network, None for a host name, wildcard or netgroup."""
    try:
        return ipaddress.ip_network(client, strict=False)
    except ValueError:
        return None


def _check_client(client: Any, setting: str, allow_world: bool) -> str:
    if not isinstance(client, str) or not client.strip():
        raise AnsibleFilterError(f"{setting}: each client must be a non-empty string, got {client!r}")
    client = client.strip()
    network = _network(client)
    world = client == "*" or (network is not None and network.prefixlen == 0)
    if world and not allow_world:
        raise AnsibleFilterError(
            f"{setting}: {client!r} exports to every host; list the client networks (e.g. 10.0.0.0/24) or set "
            "nfs_server_allow_world: true if that is really meant"
        )
    if network is None and not world and (not HOST_PATTERN.match(client) or "/" in client):
        raise AnsibleFilterError(
            f"{setting}: {client!r} is neither an address, a network (address/prefix), a host name nor an @netgroup"
        )
    return client


def _check_options(options: Any, setting: str, allow_no_root_squash: bool) -> list[str]:
    if not isinstance(options, (list, tuple)) or not options:
        raise AnsibleFilterError(f"{setting} must be a non-empty list of exports(5) options, got {options!r}")
    checked: list[str] = []
    for option in options:
        if not isinstance(option, str) or not option or any(c in option for c in " \t,()"):
            raise AnsibleFilterError(f"{setting}: {option!r} is not one exports(5) option (one per list item)")
        key, has_value, value = option.partition("=")
        if has_value and (key not in EXPORT_VALUED or not value):
            raise AnsibleFilterError(f"{setting}: {option!r} is not a known exports(5) option with a value")
        if not has_value and key not in EXPORT_FLAGS:
            raise AnsibleFilterError(f"{setting}: unknown exports(5) option {option!r}")
        checked.append(option)
    keys = {option.partition("=")[0] for option in checked}
    for first, second in EXPORT_CONFLICTS:
        if first in keys and second in keys:
            raise AnsibleFilterError(f"{setting}: {first} and {second} contradict each other; keep one")
    if "no_root_squash" in keys and not allow_no_root_squash:
        raise AnsibleFilterError(
            f"{setting}: no_root_squash lets root on every client act as root on the export; set "
            "nfs_server_allow_no_root_squash: true to allow it"
        )
    if "rw" not in keys and "ro" not in keys:
        raise AnsibleFilterError(f"{setting}: say rw or ro explicitly")
    return checked


def _check_path(path: Any, setting: str, root: str) -> str:
    if not isinstance(path, str) or not SAFE_PATH.match(path) or posixpath.normpath(path) != path or path == "/":
        raise AnsibleFilterError(
            f"{setting} must be a normalised absolute path other than / without spaces or special characters, "
            f"got {path!r}"
        )
    if root and not path.startswith(root.rstrip("/") + "/"):
        raise AnsibleFilterError(
            f"{setting} {path!r} is not under nfs_server_root {root!r}: it would be on the root disk, not the data disk"
        )
    return path


def dinops_nfs_export_lines(
    exports: Any,
    clients: Any,
    options: Any,
    allow_world: bool = False,
    allow_no_root_squash: bool = False,
    mountpoint: str = "",
) -> list[str]:
    """The lines of /etc/exports.d/dinops.exports, one per export: ``path client(options) client(options)``.

    ``exports`` is nfs_server_exports: a list of {path, options (optional), clients (optional)}; ``clients`` and
    ``options`` (nfs_server_clients, nfs_server_export_options) apply where an export gives none. ``mountpoint``
    (nfs_server_root when a data disk is used) adds exports(5)'s ``mountpoint=<path>``: nothing is exported while
    the data disk is not mounted, so the empty directory under it on the root disk is never served.
    """
    if not isinstance(exports, (list, tuple)) or not exports:
        raise AnsibleFilterError(f"nfs_server_exports must be a non-empty list of {{path: ...}}, got {exports!r}")
    if mountpoint:
        _check_path(mountpoint, "nfs_server_root", "")
    lines: list[str] = []
    seen: set[str] = set()
    for index, export in enumerate(exports):
        setting = f"nfs_server_exports[{index}]"
        if not isinstance(export, dict) or "path" not in export:
            raise AnsibleFilterError(f"{setting} must be a dict with a path, got {export!r}")
        unknown = set(export) - {"path", "options", "clients"}
        if unknown:
            raise AnsibleFilterError(f"{setting} has unknown keys {sorted(unknown)} (known: path, options, clients)")
        path = _check_path(export["path"], f"{setting}.path", mountpoint)
        if path in seen:
            raise AnsibleFilterError(f"{setting}.path {path!r} is exported twice")
        seen.add(path)
        export_clients = export.get("clients", clients)
        clients_setting = f"{setting}.clients" if "clients" in export else "nfs_server_clients"
        if not isinstance(export_clients, (list, tuple)) or not export_clients:
            raise AnsibleFilterError(
                f"{clients_setting} must list the hosts or networks that may mount {path} (e.g. the GPU hosts' "
                f"network, 10.0.0.0/24), got {export_clients!r}"
            )
        export_options = _check_options(
            export.get("options", options),
            f"{setting}.options" if "options" in export else "nfs_server_export_options",
            allow_no_root_squash,
        )
        if mountpoint and not any(o.partition("=")[0] in ("mountpoint", "mp") for o in export_options):
            export_options = [*export_options, f"mountpoint={mountpoint}"]
        checked = [_check_client(client, clients_setting, allow_world) for client in export_clients]
        lines.append(" ".join([path, *(f"{client}({','.join(export_options)})" for client in checked)]))
    return lines


def dinops_nfs_ufw_sources(clients: Any, exports: Any = ()) -> list[str]:
    """The source networks of the ufw rules for 2049/tcp: every client of every export, as address/prefix.

    ufw takes addresses and networks only (ufw(8) "from ADDRESS"); a host name or netgroup cannot be opened in the
    firewall, so it is refused with a message naming it.
    """
    every = list(clients or [])
    for export in exports or []:
        if isinstance(export, dict):
            every.extend(export.get("clients") or [])
    sources: list[str] = []
    for client in every:
        network = _network(str(client).strip()) if client != "*" else ipaddress.ip_network("0.0.0.0/0")
        if network is None:
            raise AnsibleFilterError(
                f"ufw is active and NFS client {client!r} is a host name or netgroup: ufw rules need addresses or "
                "networks. Give nfs_server_clients as addresses/networks, or set nfs_server_ufw: false and open "
                "2049/tcp yourself"
            )
        if str(network) not in sources:
            sources.append(str(network))
    return sources


def _blkid_fields(stdout: str) -> dict[str, str]:
    fields = {}
    for line in (stdout or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


# Kernel names follow probe order: on a cloud instance /dev/nvme1n1 may be an instance-store disk (m5d, c6id, ...)
# or another blank EBS volume, and a blank disk is what this role formats.
KERNEL_DISK_NAME = re.compile(r"^/dev/(sd[a-z]+|xvd[a-z]+|vd[a-z]+|hd[a-z]+|nvme[0-9]+n[0-9]+)(p?[0-9]+)?$")


def dinops_nfs_data_device_problem(device: Any) -> str:
    """Why ``nfs_server_data_device`` cannot be used ("" when it can): a kernel name such as /dev/nvme1n1 or
    /dev/sdb names whichever disk the kernel found in that place at this boot."""
    text = str(device or "").strip()
    if KERNEL_DISK_NAME.match(text):
        return (
            f"nfs_server_data_device {text} is a kernel name, which follows the order the disks were found in: on a "
            "cloud instance it can name an instance-store disk or another blank volume, and a blank disk is what "
            "this role formats. Give a stable path: /dev/disk/by-id/... (on EC2 Nitro: "
            "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol<volume id without its dash>), /dev/disk/by-uuid/, "
            "/dev/disk/by-path/ or /dev/mapper/... (ls -l /dev/disk/by-id/ shows them). Nothing was changed."
        )
    return ""


def dinops_nfs_disk_plan(
    blkid_rc: Any,
    blkid_stdout: str,
    device: str,
    fstype: str,
    head_blank: Any = False,
    setting: str = "nfs_server_data_device",
    fstype_setting: str = "nfs_server_data_fstype",
) -> dict[str, str]:
    """Format the data disk or keep it, from ``blkid -p -o export <device>``: never reformat.

    Returns {"action": "format"} only for a device with no signature at all (blkid exit 2) whose first MiB is all
    zeros (``head_blank``: ``cmp --bytes=1048576 <device> /dev/zero`` exited 0), as a new volume is; {"action":
    "keep", "uuid": ...} for one that already holds ``fstype``. Anything else (another filesystem, a partition
    table, RAID or LVM member, an ambivalent probe, or bytes blkid cannot name: a damaged superblock, data written
    without a filesystem) stops the run: the disk may hold someone's data. ``setting`` and ``fstype_setting`` name
    the variables that gave the device and the filesystem (this role's, or cloud_aws') in the messages.
    """
    rc = int(blkid_rc)
    if rc == 2:
        if head_blank is True:
            return {"action": "format", "uuid": ""}
        raise AnsibleFilterError(
            f"{setting} {device}: no signature blkid knows, but its first MiB is not blank: it may hold a filesystem "
            f"whose superblock is damaged (try fsck -b with a backup superblock, or restore the volume from a "
            f"snapshot) or data written without a filesystem. Refusing to format it; if its data is not needed, "
            f"zero it yourself (blkdiscard {device}, or dd if=/dev/zero of={device} bs=1M count=1) and run again. "
            "Nothing was changed."
        )
    if rc == 8:
        raise AnsibleFilterError(
            f"{setting} {device}: blkid found several colliding signatures; inspect it with wipefs {device} "
            "(nothing was changed)"
        )
    if rc != 0:
        raise AnsibleFilterError(f"{setting} {device}: blkid -p failed with exit status {rc}; is it a block device?")
    fields = _blkid_fields(blkid_stdout)
    found = fields.get("TYPE", "")
    if "PTTYPE" in fields and not found:
        raise AnsibleFilterError(
            f"{setting} {device} holds a {fields['PTTYPE']} partition table; give the partition (e.g. {device}1) or "
            f"wipe the disk yourself (wipefs -a {device}) if its data is not needed. Nothing was changed."
        )
    if found != fstype:
        keep = f"set {fstype_setting}: {found} to keep its data, or " if found in SUPPORTED_FSTYPES else ""
        raise AnsibleFilterError(
            f"{setting} {device} already holds {found or 'an unknown signature'} (blkid), not "
            f"{fstype_setting} {fstype}: refusing to reformat it; {keep}wipe it yourself (wipefs -a {device}) "
            "if its data is not needed. Nothing was changed."
        )
    if not fields.get("UUID"):
        raise AnsibleFilterError(f"{setting} {device}: its {found} filesystem has no UUID to mount it by")
    return {"action": "keep", "uuid": fields["UUID"]}


# The RPC services only NFSv2/v3 use: the portmapper and the NSM lock-recovery daemon. An NFSv4-only host masks them
# (Red Hat, "Configuring an NFSv4-only server": systemctl mask --now rpc-statd.service rpcbind.service
# rpcbind.socket, https://docs.redhat.com/en/documentation/red_hat_enterprise_linux/9/html/configuring_and_using_network_file_services/deploying-an-nfs-server_configuring-and-using-network-file-services);
# nfs-utils' nfs-server.service only Wants=rpcbind.socket, so the server still starts.
RPC_UNITS = ["rpcbind.socket", "rpcbind.service", "rpc-statd.service"]


def dinops_nfs_rpc_units(versions: Any) -> list[str]:
    """The units to mask and stop when every NFS version the host serves or mounts is 4.x; [] otherwise."""
    found = [str(v).strip() for v in versions or []]
    if found and all(v == "4" or v.startswith("4.") for v in found):
        return list(RPC_UNITS)
    return []


class FilterModule:
    """nfs_server filters."""

    def filters(self):
        return {
            "dinops_nfs_export_lines": dinops_nfs_export_lines,
            "dinops_nfs_ufw_sources": dinops_nfs_ufw_sources,
            "dinops_nfs_disk_plan": dinops_nfs_disk_plan,
            "dinops_nfs_data_device_problem": dinops_nfs_data_device_problem,
            "dinops_nfs_rpc_units": dinops_nfs_rpc_units,
        }
