"""What a node has for the dinops pods: its capacity (the host's, or minikube's share of it) less the cluster's own
pods (facts/cluster.yml), the platform's operators that may land on it (their pinned releases' requests) and the
kubelet's eviction reserve.

``dinops_node_allocatable``    what the node has for the dinops pods (facts/cluster.yml: the cluster's own share).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml


def _sibling(stem: str) -> ModuleType:
    """A sibling filter file, read by path as Ansible loads each plugin file on its own, once per process and folder
    (kept in sys.modules): every workloads filter then raises the one WorkloadsError class its callers catch."""
    name = f"dinops_workloads_{stem}:{Path(__file__).resolve().parent}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{stem}.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


WorkloadsError = _sibling("workloads_error").WorkloadsError
_require = _sibling("workloads_error").require

CLUSTERS = ("minikube", "k3s", "docker", "none")


def _int_field(profile: dict[str, Any], key: str, name: str) -> int:
    value = profile.get(key)
    _require(
        isinstance(value, (int, float, str)) and str(value).strip().isdigit() and int(value) > 0,
        f"{name} must be a positive whole number, got {value!r}",
    )
    return int(value)


def node_allocatable(
    node: dict[str, Any], facts: dict[str, Any], platform: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """What one node has for the dinops pods, after the cluster's own pods, the platform's (``platform``: what
    platform_reserve returns, by pod) and the kubelet's reservations.

    ``node`` keys: cluster (minikube, k3s, docker or none), profile (the profile's name, for messages), host_vcpus,
    host_memory_mb (the host's, or its profile's host_memory_gb * 1024), gpu_count, cluster_cpus and
    cluster_memory_mb (the profile's minikube overrides, optional), gpu_replicas (time-slicing, k3s only).
    ``facts`` is facts/cluster.yml. Returns None for cluster none (a cluster of the user's: its size is unknown),
    else {cpu_m, memory_mi, gpus, capacity_cpu_m, capacity_memory_mi, reserved: {pod: {cpu_m, memory_mi}}}.
    """
    cluster = node.get("cluster", "minikube")
    _require(cluster in CLUSTERS, f"workloads_cluster must be one of {', '.join(CLUSTERS)}, got {cluster!r}")
    if cluster == "none":
        return None
    profile = node.get("profile") or "this host"
    vcpus = _int_field(node, "host_vcpus", f"host_vcpus of profile {profile} (gpu_profile.host_vcpus)")
    memory_mb = _int_field(node, "host_memory_mb", f"host memory of profile {profile} (gpu_profile.host_memory_gb)")
    gpus = int(node.get("gpu_count") or 0)
    _require(gpus >= 0, f"gpu_count of profile {profile} must not be negative, got {gpus}")
    kind = facts[cluster]
    if cluster == "minikube":
        # roles/minikube/defaults/main.yml minikube_cpus and vars/main.yml __minikube_memory_mb.
        # 0 or empty: not set in the profile.
        cpus = int(node.get("cluster_cpus") or 0) or max(vcpus - 1, kind["node_cpus"]["minimum"])
        share = kind["node_memory"]
        memory_mb = int(node.get("cluster_memory_mb") or 0) or max(
            memory_mb * share["numerator"] // share["denominator"], share["minimum_mb"]
        )
        eviction = int(facts["kubelet"]["eviction_hard_memory_mi"])
    else:
        cpus = vcpus
        eviction = int(kind["eviction_hard_memory_mi"])
        gpus *= int(node.get("gpu_replicas") or 1)
    reserved = {
        name: {"cpu_m": int(pod["cpu_m"]), "memory_mi": int(pod["memory_mi"])}
        for name, pod in {**kind["system_pods"], **(platform or {})}.items()
    }
    capacity_cpu, capacity_memory = cpus * 1000, memory_mb
    return {
        "cluster": cluster,
        "capacity_cpu_m": capacity_cpu,
        "capacity_memory_mi": capacity_memory,
        "cpu_m": capacity_cpu - sum(p["cpu_m"] for p in reserved.values()),
        "memory_mi": capacity_memory - eviction - sum(p["memory_mi"] for p in reserved.values()),
        "gpus": gpus,
        "reserved": reserved,
    }


# The pinned platform releases: each operator's pods' requests and what a Katib search adds (pods, search_pods,
# trial_sidecar), beside the versions they were read from.
PLATFORM_RELEASES = Path(__file__).resolve().parents[2] / "platform" / "vars" / "main.yml"
# The platform components each Kubeflow kind of the layer needs on the cluster, whatever the switches say.
PLATFORM_NEEDS = {"trainjob": ("trainer",), "pytorchjob": ("training_operator",)}


def platform_reserve(settings: dict[str, Any], trial_pods: int, releases: dict[str, Any] | None = None) -> dict:
    """The platform's pods that may run on the node, {"<component>/<pod>": {cpu_m, memory_mi}}: the controllers of
    the enabled components (``settings["platform"]``: the platform stage's switches, {component: bool}, empty or
    absent without dinops_platform) and of those the layer's kinds need (workloads_train_kind, workloads_hpo,
    workloads_inference_service); with a search, Katib's suggestion pod and one metrics-collector sidecar for each
    of the ``trial_pods`` trial pods at once. Operators may land on any node: every node counts them."""
    if releases is None:
        releases = yaml.safe_load(PLATFORM_RELEASES.read_text())["platform_releases"]
    switches = settings.get("platform") or {}
    _require(isinstance(switches, dict), f"the platform switches must be a dict of booleans, got {switches!r}")
    unknown = sorted(set(switches) - set(releases))
    _require(not unknown, f"no pinned platform release for {', '.join(unknown)} (roles/platform/vars/main.yml)")
    enabled = {name for name, on in switches.items() if on}
    enabled.update(PLATFORM_NEEDS.get(str(settings.get("train_kind") or "job"), ()))
    search = bool(settings.get("hpo")) and bool(settings.get("train"))
    if search:
        enabled.add("katib")
    if settings.get("inference_service"):
        enabled.update(("kserve", "cert_manager"))
    reserve = {
        f"{name}/{pod}": {"cpu_m": int(requests["cpu_m"]), "memory_mi": int(requests["memory_mi"])}
        for name in releases
        if name in enabled
        for pod, requests in (releases[name].get("pods") or {}).items()
    }
    if search:
        katib = releases["katib"]
        for pod, requests in (katib.get("search_pods") or {}).items():
            reserve[f"katib/{pod}"] = {"cpu_m": int(requests["cpu_m"]), "memory_mi": int(requests["memory_mi"])}
        sidecar = katib["trial_sidecar"]
        reserve["katib/metrics-collector"] = {
            "cpu_m": int(sidecar["cpu_m"]) * trial_pods,
            "memory_mi": int(sidecar["memory_mi"]) * trial_pods,
        }
    return reserve


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_node_allocatable": node_allocatable}
