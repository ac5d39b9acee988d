"""What the layer of one host runs and with which requests: the apps its profile lists and the settings ask for,
where inference runs (the GPU, or the CPU while training holds it), how many training processes, and the requests
and limits of every pod so that all that runs at the same time fits on its node (node_budget.py), refused with what
is short otherwise.

``dinops_site_plan``           what that layer runs, the requests it gives each pod and what it has to say about it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


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
_quantities = _sibling("quantities")
_node_budget = _sibling("node_budget")
_monitoring = _sibling("monitoring")

OVERLAYS = ("cpu", "minikube-gpu", "k3s-gpu", "docker-gpu")
GPU_OVERLAYS = ("minikube-gpu", "k3s-gpu", "docker-gpu")
# The profile's workloads list names these; "inference" is the serve Deployment.
PROFILE_WORKLOADS = ("download", "train", "inference", "client")
# Requests and limits per pod: {cpu_m, memory_mi} requests, {cpu_m, memory_mi} limits. Fixed-size helpers first;
# serve by where it runs; train gets what is left, between its minimum and its wish, per training process.
HELPERS = {
    # 450m: the 50m Prometheus requests came from here, so that every node that fitted the download, training and
    # inference before still fits them with Prometheus (an a10g's 4-vCPU minikube node beside Trainer has no more).
    "download": {"requests": (450, 256), "limits": (2000, 1024)},
    "client": {"requests": (100, 128), "limits": (1000, 512)},
    "checkpoint": {"requests": (100, 128), "limits": (1000, 512)},
    # Prometheus (workloads_monitoring; k8s/components/monitoring): a few targets every 15 s take some millicores and
    # some tens of MiB.
    "prometheus": {"requests": (50, 192), "limits": (1000, 1024)},
}
SERVE = {
    # The model on the GPU: the CPU feeds it (decoding, pre- and post-processing).
    "gpu": {"requests": (1000, 2048), "limits": (4000, 6144)},
    # On CPU, alone: the cpu overlay's size.
    "cpu": {"requests": (500, 1024), "limits": (2000, 4096)},
    # On CPU next to training (exclusive GPU): answers slowly; training keeps the CPU it needs to feed the GPU.
    "cpu-beside-training": {"requests": (250, 1024), "limits": (2000, 4096)},
}
# Per training process (one per GPU; one on CPU): (minimum, wish). The memory request is the working set the
# node keeps for it; the limit adds /dev/shm on top (a memory emptyDir counts against the limit:
# https://kubernetes.io/docs/concepts/storage/volumes/#emptydir) and never goes below the wish.
TRAIN_CPU_M = {"gpu": (1000, 2000), "cpu": (1000, 1000)}
TRAIN_MEMORY_MI = {"gpu": (4096, 8192), "cpu": (2048, 2048)}
TRAIN_WORKING_SET_LIMIT_MI = {"gpu": 16384, "cpu": 4096}
# The init container that waits for the dataset's completion marker (`dinops data-ready`): a sleeping poller.
WAIT_FOR_DATASET = {"requests": (50, 64), "limits": (500, 256)}


def cluster_of(overlay: str) -> str:
    return {"k3s-gpu": "k3s", "docker-gpu": "docker"}.get(overlay, "minikube")


def site_plan(settings: dict[str, Any]) -> dict[str, Any]:
    """What the layer of one host runs and with which requests, from its profile and its node.

    Returns {apps: {app: bool} (download, train, serve, client, checkpoint, prometheus), serve_device (gpu or cpu),
    train_processes, notes (what the role prints), resources ({app: {requests: {cpu, memory}, limits: {...}}}, empty
    when the node is unknown), nodes ({app: node} it was sized against)}. Raises WorkloadsError naming the profile
    and what is short when the pods cannot all fit.
    """
    overlay = settings["overlay"]
    profile = settings.get("profile") or "this host"
    cluster = settings.get("cluster") or cluster_of(overlay)
    sharing = settings.get("gpu_sharing", "exclusive")
    facts = settings.get("cluster_facts") or {}
    if overlay == "minikube-gpu" or (cluster == "minikube" and overlay in GPU_OVERLAYS):
        _require(
            sharing != "time-slicing",
            f"workloads_gpu_sharing: time-slicing cannot work on minikube (profile {profile}): its "
            "nvidia-device-plugin addon advertises each GPU once, so training and inference would each wait for "
            "the only GPU. Use exclusive (inference moves to CPU while training runs) or k3s (docs/cluster.md).",
        )
    placement = settings.get("placement") or {}
    _require(isinstance(placement, dict), f"workloads_placement must be a dict, got {placement!r}")
    listed = settings.get("workloads")
    listed = list(PROFILE_WORKLOADS) if listed is None else list(listed)
    unknown = sorted(set(listed) - set(PROFILE_WORKLOADS))
    _require(not unknown, f"gpu_profile.workloads of {profile} has unknown entries {unknown}; known: "
             f"{', '.join(PROFILE_WORKLOADS)}")  # fmt: skip
    notes = []
    train = bool(settings.get("train")) and "train" in listed
    if settings.get("train") and "train" not in listed:
        notes.append(
            f"dinops_train is true but profile {profile} lists no train in gpu_profile.workloads {listed}: "
            "training is not applied on this host"
        )
    if settings.get("hpo") and not train:
        notes.append(
            f"workloads_hpo is true but profile {profile} does not train here (dinops_train and 'train' in "
            "gpu_profile.workloads): no hyperparameter search is applied on this host"
        )
    apps = {
        "train": train,
        # The role's workloads_download may say so; by default when listed, and whenever training runs.
        "download": bool(settings["download"])
        if settings.get("download") is not None
        else "download" in listed or train,
        "serve": "inference" in listed,
        "client": "client" in listed,
    }
    apps["checkpoint"] = bool(settings.get("checkpoint_url")) and apps["serve"]
    # Prometheus runs whatever else does (workloads_monitoring, on unless set false).
    apps["prometheus"] = _monitoring.monitoring_settings(settings)["enabled"]
    if settings.get("checkpoint_url") and not apps["serve"]:
        notes.append(f"workloads_checkpoint_url is set but profile {profile} runs no inference: not fetched")
    gpu = overlay in GPU_OVERLAYS
    node_settings = settings.get("node")
    gpu_count = int((node_settings or {}).get("gpu_count") or 1) if gpu else 0
    processes = max(gpu_count, 1) if train else 0
    serve_on_gpu = gpu and apps["serve"] and not (train and sharing == "exclusive")
    serve_size = "gpu" if serve_on_gpu else ("cpu-beside-training" if train else "cpu")
    plan: dict[str, Any] = {
        "apps": apps,
        "serve_device": "gpu" if serve_on_gpu else "cpu",
        "train_processes": processes,
        "train_gpus": gpu_count if train and gpu else 0,
        "notes": notes,
        "resources": {},
        "nodes": {},
    }
    if not node_settings:
        return plan
    # A search's trials at once on one node: one per GPU as Jobs, one pod per node of a TrainJob or PyTorchJob.
    trial_pods = processes if str(settings.get("train_kind") or "job") == "job" else 1
    platform = _node_budget.platform_reserve(settings, trial_pods) if cluster not in ("docker", "none") else {}
    default_node = _node_budget.node_allocatable(node_settings, facts, platform)
    if default_node is None:
        notes.append("the cluster is not one the role built (workloads_cluster none): requests are the manifests'")
        return plan
    pinned = placement.get("requests_node") or {}
    # Apps pinned to the same node share it; the others share the host's node.
    groups: dict[str, list[str]] = {}
    nodes: dict[str, dict[str, Any]] = {}
    for app in ("download", "checkpoint", "client", "prometheus", "serve", "train"):
        if not apps[app]:
            continue
        node = _pinned_node(pinned[app], node_settings, facts, platform) if pinned.get(app) else default_node
        key = json.dumps({k: node.get(k) for k in ("cpu_m", "memory_mi", "gpus")}, sort_keys=True)
        key = "host" if node is default_node else key
        groups.setdefault(key, []).append(app)
        nodes[key] = node
    resources: dict[str, Any] = {}
    for key, members in groups.items():
        resources.update(_size(members, nodes[key], serve_size, processes, plan["train_gpus"], gpu, profile, key,
                               settings))  # fmt: skip
        for app in members:
            plan["nodes"][app] = {k: nodes[key][k] for k in ("cpu_m", "memory_mi", "gpus")}
    plan["resources"] = resources
    return plan


def _pinned_node(
    raw: dict[str, Any], node_settings: dict[str, Any], facts: dict[str, Any], platform: dict[str, Any]
) -> dict[str, Any]:
    """A node of several (placement's requests_node: the raw host size {cpu_m, memory_mi, gpus} of the smallest
    node the app may land on) less the cluster's reservations. The system and platform pods may land on any node:
    counted on every one, the safe side."""
    _require(
        isinstance(raw, dict) and {"cpu_m", "memory_mi"} <= set(raw),
        f"workloads_placement requests_node entries must be {{cpu_m, memory_mi, gpus}}, got {raw!r}",
    )
    node = _node_budget.node_allocatable(
        {
            **node_settings,
            "host_vcpus": max(int(raw["cpu_m"]) // 1000, 1),
            "host_memory_mb": max(int(raw["memory_mi"]), 1),
            "gpu_count": int(raw.get("gpus") or 0),
            "cluster_cpus": 0,
            "cluster_memory_mb": 0,
        },
        facts,
        platform,
    )
    _require(node is not None, "workloads_placement needs workloads_cluster k3s, not none")
    return node


def _size(apps, node, serve_size, processes, train_gpus, gpu, profile, key, settings) -> dict[str, Any]:
    """Requests of the apps that share one node; train takes what the others leave, up to its wish."""
    where = "its node" if key == "host" else f"the node it is pinned to ({key})"
    free_cpu, free_memory, free_gpus = int(node["cpu_m"]), int(node["memory_mi"]), int(node.get("gpus", 0))
    sized: dict[str, Any] = {}
    needs = []
    for app in apps:
        if app == "train":
            continue
        size = SERVE[serve_size] if app == "serve" else HELPERS[app]
        sized[app] = size
        needs.append(f"{app} {size['requests'][0]}m/{size['requests'][1]}Mi")
        free_cpu -= size["requests"][0]
        free_memory -= size["requests"][1]
        if app == "serve" and serve_size == "gpu":
            free_gpus -= 1
    kind = "gpu" if gpu else "cpu"
    if "train" in apps:
        free_gpus -= train_gpus
        cpu_min, cpu_wish = (v * processes for v in TRAIN_CPU_M[kind])
        mem_min, mem_wish = (v * processes for v in TRAIN_MEMORY_MI[kind])
        needs.append(f"train {cpu_min}m/{mem_min}Mi at least")
        if free_cpu >= cpu_min and free_memory >= mem_min:
            cpu = min(cpu_wish, free_cpu)
            memory = min(mem_wish, free_memory)
            shm = _quantities.quantity_mi(settings["shm_size"])
            limit_memory = max(memory, TRAIN_WORKING_SET_LIMIT_MI[kind] * processes) + shm
            limit_cpu = max(cpu, min(8000 * processes, int(node["cpu_m"])))
            sized["train"] = {"requests": (cpu, memory), "limits": (limit_cpu, limit_memory)}
        free_cpu -= cpu_min
        free_memory -= mem_min
    short = []
    if free_cpu < 0:
        short.append(f"{-free_cpu}m CPU")
    if free_memory < 0:
        short.append(f"{-free_memory}Mi memory")
    if free_gpus < 0:
        short.append(f"{-free_gpus} nvidia.com/gpu")
    _require(
        not short,
        f"profile {profile}: {', '.join(apps)} cannot all fit on {where}: it can allocate {node['cpu_m']}m CPU, "
        f"{node['memory_mi']}Mi memory and {node.get('gpus', 0)} GPU(s) after the cluster's own pods "
        f"(facts/cluster.yml) and the platform's ({_platform_pods(node)}), the pods need {', '.join(needs)}; "
        f"short by {', '.join(short)}. Give the host more "
        "(gpu_profile.host_vcpus/host_memory_gb, cluster_cpus/cluster_memory_mb) or run less "
        "(gpu_profile.workloads).",
    )
    return {
        app: {
            "requests": {
                "cpu": _quantities.fmt_cpu(size["requests"][0]),
                "memory": _quantities.fmt_mem(size["requests"][1]),
            },
            "limits": {"cpu": _quantities.fmt_cpu(size["limits"][0]), "memory": _quantities.fmt_mem(size["limits"][1])},
        }
        for app, size in sized.items()
    }


def _platform_pods(node: dict[str, Any]) -> str:
    pods = [f"{name} {pod['cpu_m']}m/{pod['memory_mi']}Mi" for name, pod in node["reserved"].items() if "/" in name]
    return ", ".join(pods) or "none"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_site_plan": site_plan}
