"""What the minikube role does with a profile, decided from a read-only probe (pytest: tests/cluster/).

The probe reads the profile's ``config.json`` (what the cluster was created with) and ``minikube status -o json``
(what runs now). ``minikube start`` on a cluster that already runs is not free (it re-applies addons and may
restart components), and several properties cannot change on an existing cluster at all: minikube keeps the
old value with a warning. So the role never starts blindly; it does what this table says:

=========  ===============================================================================================
none       created with the wanted settings and running
create     no profile yet
start      created with the wanted settings but stopped (or a newer Kubernetes version: minikube upgrades
           in place)
unpause    created with the wanted settings and paused
recreate   created with settings that only a new cluster can change (driver, runtime, GPUs, CPUs, memory,
           disk, published ports, an older Kubernetes version) or a profile minikube cannot read; allowed
           only with ``minikube_allow_recreate``, because deleting the cluster deletes its volumes. Memory the
           role took from the host's MemTotal differs only beyond ``memory_tolerance_percent``: MemTotal moves
           by some MB with a kernel update, which must not cost the cluster
refuse     recreate needed but not allowed: the role stops and lists the reasons
=========  ===============================================================================================
"""

from __future__ import annotations

import json
import re
from typing import Any

ACTIONS = ("none", "create", "start", "unpause", "recreate", "refuse")
VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")
# minikube v1.37.0 cmd/minikube/cmd/start.go validateBareMetal: with the none driver any profile other than
# constants.DefaultClusterName ("minikube") exits with "The 'none' driver does not support multiple profiles".
# https://github.com/kubernetes/minikube/blob/v1.37.0/cmd/minikube/cmd/start.go
NONE_DRIVER_PROFILE = "minikube"
# The addon that registers nvidia.com/gpu. With --gpus (docker driver) minikube enables it itself
# (pkg/minikube/cruntime/docker.go, v1.37.0); with the none driver only `minikube addons enable
# nvidia-device-plugin` or `--addons=nvidia-device-plugin` does (https://minikube.sigs.k8s.io/docs/tutorials/nvidia/,
# tab "none").
GPU_ADDON = "nvidia-device-plugin"


class MinikubeDecisionError(ValueError):
    """The desired state itself is unusable (a role input error, not a cluster state)."""


def _version(text: str) -> tuple[int, int, int]:
    match = VERSION.match(str(text or ""))
    if not match:
        raise MinikubeDecisionError(f"not a Kubernetes version: {text!r} (expected like v1.33.1)")
    return int(match[1]), int(match[2]), int(match[3])


def _load(text: Any) -> dict[str, Any] | None:
    """Probe output as a dict: None when absent or not a JSON object."""
    if isinstance(text, dict):
        return text
    if not text or not str(text).strip():
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def minikube_addons(driver: str, host_gpus: Any) -> list[str]:
    """Addons ``minikube start`` must enable: the NVIDIA device plugin on a GPU host with the none driver."""
    return [GPU_ADDON] if driver == "none" and int(host_gpus or 0) > 0 else []


def _check_desired(desired: dict[str, Any]) -> None:
    if desired["driver"] == "none" and desired.get("profile") != NONE_DRIVER_PROFILE:
        raise MinikubeDecisionError(
            f"minikube_profile is {desired.get('profile')!r}, but minikube_driver none supports only the profile "
            f"{NONE_DRIVER_PROFILE!r} (minikube v1.37.0 validateBareMetal): set minikube_profile: {NONE_DRIVER_PROFILE}"
        )


def _differ(have: Any, want: Any, tolerance_percent: int) -> bool:
    """Whether ``have`` is not ``want``, or for a size with a tolerance, more than that many percent apart."""
    if tolerance_percent and isinstance(have, int) and isinstance(want, int):
        return abs(have - want) * 100 > want * tolerance_percent
    return have != want


def _immutable_differences(config: dict[str, Any], desired: dict[str, Any]) -> list[str]:
    reasons = []
    kubernetes = config.get("KubernetesConfig") or {}
    driver = desired["driver"]
    checks = [
        ("driver", config.get("Driver"), driver, 0),
        ("container runtime", kubernetes.get("ContainerRuntime"), desired["container_runtime"], 0),
    ]
    # The none driver runs on the host itself: GPUs, CPUs, memory, disk and ports are the host's.
    if driver != "none":
        memory_tolerance = int(desired.get("memory_tolerance_percent") or 0)
        checks += [
            ("GPUs", config.get("GPUs") or "", desired.get("gpus") or "", 0),
            ("CPUs", config.get("CPUs"), int(desired["cpus"]), 0),
            ("memory (MB)", config.get("Memory"), int(desired["memory_mb"]), memory_tolerance),
            ("disk (MB)", config.get("DiskSize"), int(desired["disk_mb"]), 0),
            ("published ports", sorted(config.get("ExposedPorts") or []), sorted(desired.get("ports") or []), 0),
        ]
    for what, have, want, tolerance in checks:
        if _differ(have, want, tolerance):
            apart = f" (more than {tolerance}% apart)" if tolerance else ""
            reasons.append(f"{what}: created with {have!r}, wanted {want!r}{apart}")
    return reasons


def minikube_action(config_text: Any, status_text: Any, desired: dict[str, Any]) -> dict[str, Any]:
    """Decide from the probe. Returns ``{"action": one of ACTIONS, "reasons": [sentences]}``.

    ``config_text``: the profile's config.json content ('' or None when there is no profile).
    ``status_text``: ``minikube status -o json`` output ('' when minikube printed nothing).
    ``desired``: profile, driver, container_runtime, gpus, cpus, memory_mb, disk_mb, ports, kubernetes_version,
    allow_recreate, addons (optional: addons that must be enabled; a profile without one is started again, which
    enables the ``--addons`` of ``minikube_start_args``), memory_tolerance_percent (optional: how many percent of
    memory_mb the profile's memory may differ by; 0 or absent: exactly, as for every other size).
    """
    _check_desired(desired)
    wanted_version = _version(desired["kubernetes_version"])
    if config_text is None or not str(config_text).strip():
        return {"action": "create", "reasons": ["no minikube profile yet"]}
    config = _load(config_text)
    if config is None:
        return _recreate(["the profile's config.json is not a JSON object minikube could have written"], desired)

    reasons = _immutable_differences(config, desired)
    have_version_text = (config.get("KubernetesConfig") or {}).get("KubernetesVersion", "")
    try:
        have_version = _version(have_version_text)
    except MinikubeDecisionError:
        reasons.append(f"Kubernetes version: created with {have_version_text!r}, which is not a version")
        have_version = wanted_version
    if have_version > wanted_version:
        reasons.append(
            f"Kubernetes version: created with {have_version_text}, wanted {desired['kubernetes_version']} "
            "(minikube cannot downgrade a cluster)"
        )
    if reasons:
        return _recreate(reasons, desired)

    if have_version < wanted_version:
        return {
            "action": "start",
            "reasons": [f"Kubernetes {have_version_text} is upgraded in place to {desired['kubernetes_version']}"],
        }

    enabled = config.get("Addons") or {}
    missing = [addon for addon in desired.get("addons") or [] if not enabled.get(addon)]
    if missing:
        return {"action": "start", "reasons": [f"addons not enabled: {', '.join(missing)}"]}

    status = _load(status_text) or {}
    components = {key: status.get(key) for key in ("Host", "Kubelet", "APIServer")}
    if all(state == "Running" for state in components.values()):
        return {"action": "none", "reasons": ["running with the wanted settings"]}
    if components["APIServer"] == "Paused":
        return {"action": "unpause", "reasons": ["the cluster is paused"]}
    described = ", ".join(f"{key} {value or 'unknown'}" for key, value in components.items())
    return {"action": "start", "reasons": [f"not running ({described})"]}


def _recreate(reasons: list[str], desired: dict[str, Any]) -> dict[str, Any]:
    if desired.get("allow_recreate"):
        return {"action": "recreate", "reasons": reasons}
    return {"action": "refuse", "reasons": reasons}


def minikube_start_args(desired: dict[str, Any]) -> list[str]:
    """The ``minikube start`` arguments that create a profile matching ``desired`` (and what the probe checks)."""
    _check_desired(desired)
    args = [
        f"--profile={desired['profile']}",
        f"--driver={desired['driver']}",
        f"--container-runtime={desired['container_runtime']}",
        f"--kubernetes-version={desired['kubernetes_version']}",
    ]
    if desired["driver"] != "none":
        args += [f"--cpus={int(desired['cpus'])}", f"--memory={int(desired['memory_mb'])}mb"]
        args += [f"--disk-size={int(desired['disk_mb'])}mb"]
        if desired.get("gpus"):
            args.append(f"--gpus={desired['gpus']}")
        args += [f"--ports={port}" for port in sorted(desired.get("ports") or [])]
    args += [f"--addons={addon}" for addon in desired.get("addons") or []]
    args += [str(arg) for arg in desired.get("extra_args") or []]
    return args


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "minikube_action": minikube_action,
            "minikube_start_args": minikube_start_args,
            "minikube_addons": minikube_addons,
        }
