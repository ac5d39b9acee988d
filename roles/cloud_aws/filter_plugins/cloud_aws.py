"""Decisions of the cloud_aws role, as pure functions over ec2_instance_info results and the machine plan."""

from __future__ import annotations

import importlib.util
import ipaddress
from functools import cache
from pathlib import Path
from typing import Any

# SSH from a network wider than a /8 (16.7 million addresses) is refused unless cloud_aws_ssh_open_world says so.
SSH_WIDEST_PREFIX = 8
# Nitro instances (every GPU type in the default table) expose an EBS volume as an NVMe device whose serial is
# the volume id without its dash; udev names it after that serial.
NVME_EBS_BY_ID = "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_"
# The Role tag of the data server's instance (GPU instances carry a GpuProfile tag instead); its data volume,
# like every machine's, is tagged Role=data.
DATA_SERVER_ROLE = "data-server"


def _machine_tag(instance: dict[str, Any]) -> str | None:
    return (instance.get("tags") or {}).get("Machine")


def _is_data_server(instance: dict[str, Any]) -> bool:
    return (instance.get("tags") or {}).get("Role") == DATA_SERVER_ROLE


def cloud_aws_planned_machines(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every machine cloud_up runs: the GPU machines, then the data server when the plan has one."""
    data_server = plan.get("data_server")
    return [*plan["machines"], *([data_server] if data_server else [])]


def cloud_aws_outdated_instances(instances: list[dict[str, Any]], machines: list[dict[str, Any]]) -> list[dict]:
    """Instances of planned machines whose profile or instance type differs from the plan."""
    planned = {m["name"]: m for m in machines}
    outdated = []
    for instance in instances:
        machine = planned.get(_machine_tag(instance))
        if machine is None:
            continue
        profile = (instance.get("tags") or {}).get("GpuProfile")
        reasons = []
        was_data_server, is_data_server = _is_data_server(instance), machine.get("role") == DATA_SERVER_ROLE
        if was_data_server != is_data_server:
            reasons.append("data server -> GPU machine" if was_data_server else "GPU machine -> data server")
        elif profile != machine["profile"]:
            reasons.append(f"profile {profile} -> {machine['profile']}")
        if instance.get("instance_type") != machine["instance_type"]:
            reasons.append(f"instance type {instance.get('instance_type')} -> {machine['instance_type']}")
        if reasons:
            outdated.append(
                {"machine": machine["name"], "instance_id": instance["instance_id"], "reason": ", ".join(reasons)}
            )
    return outdated


def cloud_aws_unplanned_instances(instances: list[dict[str, Any]], machines: list[dict[str, Any]]) -> list[dict]:
    """Instances of this deployment that no planned machine describes (left alone by cloud_up)."""
    names = {m["name"] for m in machines}
    return [
        {"machine": _machine_tag(i), "instance_id": i["instance_id"], "data_server": _is_data_server(i)}
        for i in instances
        if _machine_tag(i) not in names
    ]


def cloud_aws_instance_tags(machine: dict[str, Any], common_tags: dict[str, str]) -> dict[str, str]:
    """Tags of a machine's instance: the deployment's tags plus what the dynamic inventory groups by."""
    if machine.get("role") == DATA_SERVER_ROLE:
        return {**common_tags, "Machine": machine["name"], "Role": DATA_SERVER_ROLE}
    return {
        **common_tags,
        "Machine": machine["name"],
        "GpuProfile": machine["profile"],
        "Workloads": ",".join(machine["workloads"]),
    }


def cloud_aws_host_groups(machine: dict[str, Any]) -> list[str]:
    """The in-memory inventory groups of a launched machine, the same as the dynamic inventory's."""
    if machine.get("role") == DATA_SERVER_ROLE:
        return ["cloud_aws_launched", "data_servers"]
    return ["cloud_aws_launched", "gpu_hosts", machine["profile"]]


def cloud_aws_down_selection(
    instances: list[dict[str, Any]], volumes: list[dict[str, Any]], down_data_server: bool, delete_data: bool
) -> dict[str, Any]:
    """What cloud_down terminates, deletes and keeps among this deployment's instances and data volumes.

    The data server (Role tag data-server) is kept unless ``down_data_server``; its data volume is then kept even
    with ``delete_data``, and so are the security group and key pair it still uses (``keep_shared``).
    """

    def entry(instance: dict[str, Any]) -> dict[str, Any]:
        machine, instance_id = _machine_tag(instance), instance["instance_id"]
        return {"machine": machine, "instance_id": instance_id, "label": f"{instance_id} ({machine})"}

    kept = [entry(i) for i in instances if _is_data_server(i) and not down_data_server]
    kept_machines = {k["machine"] for k in kept}
    own_volumes = [v for v in volumes if (v.get("tags") or {}).get("Machine") in kept_machines]
    other_volumes = [v for v in volumes if v not in own_volumes]
    return {
        "terminate": [entry(i) for i in instances if not (_is_data_server(i) and not down_data_server)],
        "keep": kept,
        "delete_volumes": [v["id"] for v in other_volumes] if delete_data else [],
        "keep_volumes": [v["id"] for v in own_volumes + ([] if delete_data else other_volumes)],
        "keep_shared": bool(kept),
    }


def cloud_aws_launched(instance_results: list[dict[str, Any]], data_device_name: str) -> list[dict[str, Any]]:
    """One entry per machine from the ec2_instance loop results: its instance and attached data volume, if any."""
    launched = []
    for result in instance_results:
        instance = result["instances"][0]
        mapped = [m for m in instance.get("block_device_mappings", []) if m.get("device_name") == data_device_name]
        launched.append(
            {
                "machine": result["__cloud_aws_machine"],
                "instance_id": instance["instance_id"],
                "address": instance.get("public_ip_address") or instance.get("private_ip_address"),
                "private_address": instance.get("private_ip_address"),
                "data_volume_id": mapped[0]["ebs"]["volume_id"] if mapped else None,
            }
        )
    return launched


def cloud_aws_with_volumes(launched: list[dict[str, Any]], volume_results: list[dict[str, Any]]) -> list[dict]:
    """``launched`` with the volume ids that ec2_vol just attached filled in."""
    attached = {r["__cloud_aws_launch"]["machine"]["name"]: r["volume_id"] for r in volume_results if "volume_id" in r}
    return [
        {**entry, "data_volume_id": attached.get(entry["machine"]["name"], entry["data_volume_id"])}
        for entry in launched
    ]


def cloud_aws_data_device(volume_id: str) -> str:
    """Stable device path of an attached EBS volume on a Nitro instance."""
    if not volume_id.startswith("vol-"):
        raise ValueError(f"not an EBS volume id: {volume_id!r}")
    return NVME_EBS_BY_ID + volume_id.replace("-", "", 1)


@cache
def _nfs_server_filters():
    """The nfs_server role's filters, read from their file: one data-disk plan for both roles (Ansible gives a role
    only its own filter_plugins, and both roles live in this repository's roles/)."""
    path = Path(__file__).resolve().parents[2] / "nfs_server" / "filter_plugins" / "nfs_server.py"
    spec = importlib.util.spec_from_file_location("dinops_nfs_server_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cloud_aws_data_volume_plan(blkid_rc: Any, blkid_stdout: str, device: str, fstype: str, head_blank: Any) -> dict:
    """Format the data volume or keep it: the nfs_server role's plan (never format a volume that holds anything,
    roles/nfs_server/filter_plugins/nfs_server.py dinops_nfs_disk_plan), its messages naming this role's variables."""
    return _nfs_server_filters().dinops_nfs_disk_plan(
        blkid_rc, blkid_stdout, device, fstype, head_blank, "cloud_aws_data_device", "cloud_aws_data_filesystem"
    )


def cloud_aws_ssh_cidr_problem(cidr: Any, open_world: Any) -> str:
    """Why ``cloud_aws_ssh_cidr`` is refused, or "" when it is fine: not an IPv4 CIDR, or wider than a /8 without
    ``cloud_aws_ssh_open_world``."""
    text = str(cidr or "").strip()
    try:
        network = ipaddress.IPv4Network(text, strict=False) if "/" in text else None
    except ValueError:
        network = None
    if network is None:
        return (
            f"cloud_aws_ssh_cidr must be the IPv4 CIDR allowed to reach SSH, e.g. 203.0.113.7/32 (got '{text}'). "
            "Nothing was created."
        )
    if network.prefixlen < SSH_WIDEST_PREFIX and not open_world:
        return (
            f"cloud_aws_ssh_cidr {network} opens SSH to {network.num_addresses} addresses (a prefix shorter than "
            f"/{SSH_WIDEST_PREFIX}): give the address you connect from (e.g. 203.0.113.7/32), or set "
            "cloud_aws_ssh_open_world: true if SSH must be reachable from anywhere. Nothing was created."
        )
    return ""


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "cloud_aws_planned_machines": cloud_aws_planned_machines,
            "cloud_aws_outdated_instances": cloud_aws_outdated_instances,
            "cloud_aws_unplanned_instances": cloud_aws_unplanned_instances,
            "cloud_aws_instance_tags": cloud_aws_instance_tags,
            "cloud_aws_host_groups": cloud_aws_host_groups,
            "cloud_aws_down_selection": cloud_aws_down_selection,
            "cloud_aws_data_device": cloud_aws_data_device,
            "cloud_aws_data_volume_plan": cloud_aws_data_volume_plan,
            "cloud_aws_launched": cloud_aws_launched,
            "cloud_aws_with_volumes": cloud_aws_with_volumes,
            "cloud_aws_ssh_cidr_problem": cloud_aws_ssh_cidr_problem,
        }
