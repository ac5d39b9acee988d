"""Turn the machines described in the inventory into a checked plan that a provider role can apply.

``cloud_machines_plan`` is a pure function: every error in the description is collected and reported at once,
before any provider is called, so a typo never creates (or bills) anything.
"""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

MACHINE_KEYS = {"name", "profile", "root_volume_gb", "data_volume_gb", "market", "workloads"}
DATA_SERVER_KEYS = {"enabled", "name", "instance_type", "root_volume_gb", "data_volume_gb", "market"}
MARKETS = ("on-demand", "spot")
# Machine names end up in host names, tag values and volume names.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$")
MIN_ROOT_VOLUME_GB = 30
# The data server's root disk holds only the OS and the NFS server; its data lives on the data volume.
MIN_DATA_SERVER_ROOT_VOLUME_GB = 20


def _int_setting(machine: dict[str, Any], defaults: dict[str, Any], key: str, errors: list[str], where: str) -> int:
    value = machine.get(key, defaults.get(key))
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(f"{where}: {key} must be a whole number of GB, got {value!r}")
        return 0
    return value


def _check_volume_sizes(root_gb: int, data_gb: int, settings: dict[str, Any], errors: list[str], where: str) -> None:
    for key, size in (("root_volume_gb", root_gb), ("data_volume_gb", data_gb)):
        if size < 0 or size > settings["max_volume_gb"]:
            errors.append(
                f"{where}: {key} {size} is outside 0..{settings['max_volume_gb']} (cloud_machines_max_volume_gb)"
            )


def _machine_plan(
    machine: Any, settings: dict[str, Any], instance_types: dict[str, str], errors: list[str], index: int
) -> dict[str, Any] | None:
    if not isinstance(machine, dict):
        errors.append(f"machine #{index + 1}: must be a dict with name and profile, got {machine!r}")
        return None
    name = machine.get("name")
    where = f"machine {name!r}" if name else f"machine #{index + 1}"
    unknown_keys = sorted(set(machine) - MACHINE_KEYS)
    if unknown_keys:
        errors.append(f"{where}: unknown keys {unknown_keys}; allowed: {sorted(MACHINE_KEYS)}")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        errors.append(f"{where}: name must be 2-32 lower-case letters, digits or dashes, starting with a letter")
    profiles = settings["profiles"]
    profile = machine.get("profile")
    provider, region = settings["provider"], settings["region"]
    instance_type = None
    if profile not in profiles:
        errors.append(f"{where}: unknown GPU profile {profile!r}; known profiles: {', '.join(sorted(profiles))}")
    elif profile not in instance_types:
        offered = ", ".join(f"{p} ({t})" for p, t in sorted(instance_types.items())) or "none"
        errors.append(
            f"{where}: GPU profile {profile!r} has no instance type for {provider} in {region}; "
            f"offered there: {offered} (cloud_machines_instance_types)"
        )
    else:
        instance_type = instance_types[profile]
        if instance_type not in settings["allowed_instance_types"]:
            errors.append(
                f"{where}: instance type {instance_type} (profile {profile}) is not in "
                f"cloud_machines_allowed_instance_types {settings['allowed_instance_types']}; add it there if you "
                "really mean to pay for it"
            )
    defaults = settings["machine_defaults"]
    root_gb = _int_setting(machine, defaults, "root_volume_gb", errors, where)
    data_gb = _int_setting(machine, defaults, "data_volume_gb", errors, where)
    if root_gb and root_gb < MIN_ROOT_VOLUME_GB:
        errors.append(f"{where}: root_volume_gb {root_gb} is too small for the driver and images (>= 30)")
    _check_volume_sizes(root_gb, data_gb, settings, errors, where)
    market = machine.get("market", defaults.get("market"))
    if market not in MARKETS:
        errors.append(f"{where}: market must be one of {', '.join(MARKETS)}, got {market!r}")
    workloads = machine.get("workloads", profiles.get(profile, {}).get("workloads", []))
    if not isinstance(workloads, list) or not set(workloads) <= set(settings["workload_names"]):
        errors.append(f"{where}: workloads must be a list of {settings['workload_names']}, got {workloads!r}")
    profile_info = profiles.get(profile, {})
    return {
        "name": name,
        "profile": profile,
        "instance_type": instance_type,
        "gpu": profile_info.get("gpu"),
        "gpu_memory_gb": profile_info.get("gpu_memory_gb"),
        "root_volume_gb": root_gb,
        "data_volume_gb": data_gb,
        "market": market,
        "workloads": workloads,
        "role": "gpu",
    }


def _data_server_plan(
    data_server: Any, settings: dict[str, Any], machine_names: list[str], errors: list[str]
) -> dict[str, Any] | None:
    """The always-on CPU machine that serves the data over NFS, or None when it is not enabled."""
    where = "cloud_machines_data_server"
    if not isinstance(data_server, dict):
        errors.append(f"{where} must be a dict with enabled and optionally {sorted(DATA_SERVER_KEYS - {'enabled'})}")
        return None
    unknown_keys = sorted(set(data_server) - DATA_SERVER_KEYS)
    if unknown_keys:
        errors.append(f"{where}: unknown keys {unknown_keys}; allowed: {sorted(DATA_SERVER_KEYS)}")
    enabled = data_server.get("enabled", False)
    if not isinstance(enabled, bool):
        errors.append(f"{where}: enabled must be true or false, got {enabled!r}")
    if enabled is not True:
        return None
    defaults = settings["data_server_defaults"]
    name = data_server.get("name", defaults.get("name"))
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        errors.append(f"{where}: name must be 2-32 lower-case letters, digits or dashes, starting with a letter")
    elif name in machine_names:
        errors.append(f"{where}: name {name!r} is also a machine of cloud_machines_list; names must be unique")
    instance_type = data_server.get("instance_type", defaults.get("instance_type"))
    allowed = settings["data_server_allowed_instance_types"]
    if instance_type not in allowed:
        errors.append(
            f"{where}: instance type {instance_type!r} is not in cloud_machines_data_server_allowed_instance_types "
            f"{allowed}; add it there if you really mean to pay for it around the clock"
        )
    root_gb = _int_setting(data_server, defaults, "root_volume_gb", errors, where)
    data_gb = _int_setting(data_server, defaults, "data_volume_gb", errors, where)
    if root_gb and root_gb < MIN_DATA_SERVER_ROOT_VOLUME_GB:
        errors.append(
            f"{where}: root_volume_gb {root_gb} is too small for the OS (>= {MIN_DATA_SERVER_ROOT_VOLUME_GB})"
        )
    if data_gb == 0:
        errors.append(f"{where}: data_volume_gb must be at least 1: the data server exists to serve its data volume")
    _check_volume_sizes(root_gb, data_gb, settings, errors, where)
    market = data_server.get("market", defaults.get("market"))
    if market == "spot":
        errors.append(
            f"{where}: market spot is refused: the data server is always on and AWS may reclaim a spot instance "
            "at any time, cutting every GPU machine off its data; use on-demand"
        )
    elif market != "on-demand":
        errors.append(f"{where}: market must be on-demand, got {market!r}")
    return {
        "name": name,
        "role": "data-server",
        "profile": None,
        "instance_type": instance_type,
        "root_volume_gb": root_gb,
        "data_volume_gb": data_gb,
        "market": "on-demand",
        "workloads": [],
    }


def cloud_machines_plan(machines: Any, settings: dict[str, Any], check_list: bool = True) -> dict[str, Any]:
    """Return the plan for ``machines`` or raise one AnsibleFilterError listing every problem.

    ``settings`` holds the role's inputs without the ``cloud_machines_`` prefix: project, deployment, owner,
    provider, region, profiles, instance_types, machine_defaults, workload_names, max_instances,
    allowed_instance_types, max_volume_gb, data_server, data_server_defaults,
    data_server_allowed_instance_types. With ``check_list`` false only the identity is checked and the plan has
    no machines and no data server (teardown needs no valid list).
    """
    errors: list[str] = []
    for key in ("project", "deployment"):
        value = settings.get(key)
        if not isinstance(value, str) or not NAME_PATTERN.match(value):
            errors.append(f"cloud_machines_{key} must be 2-32 lower-case letters, digits or dashes, got {value!r}")
    owner = settings.get("owner")
    if not isinstance(owner, str) or not owner.strip():
        errors.append("cloud_machines_owner is empty: set it to who pays for these machines (it becomes the Owner tag)")
    provider, region = settings["provider"], settings["region"]
    regions = settings["instance_types"].get(provider, {})
    planned: list[dict[str, Any]] = []
    data_server = None
    if check_list:
        if region not in regions:
            errors.append(
                f"no instance types for {provider} in region {region!r}; regions in cloud_machines_instance_types: "
                f"{', '.join(sorted(regions)) or 'none'}"
            )
        data_server_wanted = isinstance(settings["data_server"], dict) and settings["data_server"].get("enabled")
        if not isinstance(machines, list) or (not machines and data_server_wanted is not True):
            errors.append(
                "cloud_machines_list is empty: describe at least one machine (name, profile) "
                "or enable cloud_machines_data_server"
            )
            machines = []
        if len(machines) > settings["max_instances"]:
            errors.append(
                f"{len(machines)} machines requested but cloud_machines_max_instances is {settings['max_instances']}: "
                "nothing was created; raise the cap if you mean it"
            )
        for index, machine in enumerate(machines):
            plan = _machine_plan(machine, settings, regions.get(region, {}), errors, index)
            if plan is not None:
                planned.append(plan)
        names = [m["name"] for m in planned]
        duplicates = sorted({n for n in names if names.count(n) > 1 and n})
        if duplicates:
            errors.append(f"machine names must be unique; repeated: {', '.join(duplicates)}")
        data_server = _data_server_plan(settings["data_server"], settings, names, errors)
    if errors:
        raise AnsibleFilterError("Invalid cloud machine description:\n- " + "\n- ".join(errors))
    tags = {"Project": settings["project"], "Deployment": settings["deployment"], "Owner": settings["owner"]}
    return {
        "provider": provider,
        "region": region,
        "project": settings["project"],
        "deployment": settings["deployment"],
        "owner": settings["owner"],
        "tags": tags,
        "machines": planned,
        "data_server": data_server,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"cloud_machines_plan": cloud_machines_plan}
