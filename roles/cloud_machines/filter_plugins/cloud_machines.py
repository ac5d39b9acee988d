"""Turn the machines described in the inventory into a checked plan that a provider role can apply.

``cloud_machines_plan`` is a pure function: every error in the description is collected and reported at once,
before any provider is called, so a typo never creates (or bills) anything.
"""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

MACHINE_KEYS = {"name", "profile", "root_volume_gb", "data_volume_gb", "market", "workloads"}
MARKETS = ("on-demand", "spot")
# Machine names end up in host names, tag values and volume names.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$")
MIN_ROOT_VOLUME_GB = 30


def _int_setting(machine: dict[str, Any], defaults: dict[str, Any], key: str, errors: list[str], where: str) -> int:
    value = machine.get(key, defaults.get(key))
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(f"{where}: {key} must be a whole number of GB, got {value!r}")
        return 0
    return value


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
    for key, size in (("root_volume_gb", root_gb), ("data_volume_gb", data_gb)):
        if size < 0 or size > settings["max_volume_gb"]:
            errors.append(
                f"{where}: {key} {size} is outside 0..{settings['max_volume_gb']} (cloud_machines_max_volume_gb)"
            )
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
    }


def cloud_machines_plan(machines: Any, settings: dict[str, Any], check_list: bool = True) -> dict[str, Any]:
    """Return the plan for ``machines`` or raise one AnsibleFilterError listing every problem.

    ``settings`` holds the role's inputs without the ``cloud_machines_`` prefix: project, deployment, owner,
    provider, region, profiles, instance_types, machine_defaults, workload_names, max_instances,
    allowed_instance_types, max_volume_gb. With ``check_list`` false only the identity is checked and the
    plan has no machines (teardown needs no valid list).
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
    if check_list:
        if region not in regions:
            errors.append(
                f"no instance types for {provider} in region {region!r}; regions in cloud_machines_instance_types: "
                f"{', '.join(sorted(regions)) or 'none'}"
            )
        if not isinstance(machines, list) or not machines:
            errors.append("cloud_machines_list is empty: describe at least one machine (name, profile)")
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
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"cloud_machines_plan": cloud_machines_plan}
