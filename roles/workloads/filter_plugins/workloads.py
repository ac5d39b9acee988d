"""Decisions of the workloads role, kept out of YAML so that pytest can check them without a cluster.

``dinops_site_kustomization``  the generated top layer: the inventory's overlay plus the host's GPU profile.
``dinops_site_plan``           what that layer runs, the requests it gives each pod and what it has to say about it.
``dinops_node_allocatable``    what the node has for the dinops pods (facts/cluster.yml: the cluster's own share).
``dinops_prepare_objects``     the rendered objects to apply: training only when asked, Jobs stamped with a hash.
``dinops_jobs_to_replace``     Jobs (and TrainJobs, PyTorchJobs) whose stamped template hash changed (their
                               templates are immutable, so they are deleted and created again; training then
                               resumes from its checkpoint).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import yaml

OVERLAYS = ("cpu", "minikube-gpu", "k3s-gpu", "docker-gpu")
GPU_OVERLAYS = ("minikube-gpu", "k3s-gpu", "docker-gpu")
GPU_SHARING = ("exclusive", "time-slicing")
APPS = ("download", "train", "serve", "client")
# The generated ConfigMap each key of the config setting merges into.
CONFIG_MAPS = {app: f"dinops-{app}-config" for app in (*APPS, "checkpoint")} | {
    "checkpoint-urls": "dinops-checkpoint-urls"
}
# The ConfigMaps of the checkpoint component: new in the layer, not merged into the base's.
LAYER_CONFIG_MAPS = ("checkpoint-urls", "checkpoint")
GPU_RESOURCE = "nvidia.com/gpu"
IMAGES = ("dinops-download", "dinops-train", "dinops-serve", "dinops-client")
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
# Where the inference Deployment mounts the output volume (k8s/base/deployment-serve.yaml).
CHECKPOINT_MOUNT = "/models"
TEMPLATE_HASH_ANNOTATION = "dinops.io/template-sha256"
TRAIN_JOB = "dinops-train"
DOWNLOAD_JOB = "dinops-download"
# Kubernetes quantity: a number with an optional binary or decimal suffix.
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
# Both volumes on an NFS export (k8s/components/nfs-storage): the volumes the component adds, by claim.
NFS_COMPONENT = "components/nfs-storage"
NFS_VOLUMES = {"dataset": "dinops-dataset-nfs", "output": "dinops-output-nfs"}
# What a PV's nfs.server takes: a DNS name (RFC 1123 labels), or an address (IPv4, bracket-less IPv6) that
# ipaddress parses.
NFS_SERVER = re.compile(
    r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
NFS_OPTION = re.compile(r"^[A-Za-z0-9_.=:/-]+$")
# Checkpoints and results in S3 (dinops train --output-s3): the component giving the pods the Secret dinops-s3.
S3_COMPONENT = "components/s3-credentials"
# Egress to S3 for the API when it serves from a bucket (its NetworkPolicy otherwise allows DNS only).
S3_POLICY_COMPONENT = "components/network-policy-s3"
# A public web client: login and TLS from the Secret dinops-client-auth (docs/security.md).
CLIENT_AUTH_COMPONENT = "components/client-auth"
# Inference as a KServe InferenceService (workloads_inference_service; filter_plugins/inference_service.py).
ISVC_COMPONENT = "components/inferenceservice"
S3_SERVE_TMP = "4Gi"
# s3://bucket[/prefix]: bucket names are 3-63 lower-case letters, digits, dots and hyphens, starting and ending with
# a letter or digit (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
S3_URL = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
# How training runs (workloads_train_kind): the batch Job, or a Kubeflow kind from its component, folded from the Job
# after kustomize (filter_plugins/train_kinds.py). HPO (workloads_hpo) adds the Katib Experiment's component.
TRAIN_KINDS = ("job", "trainjob", "pytorchjob")
TRAIN_KIND_COMPONENTS = {"trainjob": "components/trainjob", "pytorchjob": "components/pytorchjob"}
HPO_COMPONENT = "components/katib-experiment"
# The shared-storage component placement.py adds for a k3s cluster of several nodes (ReadWriteMany claims).
SHARED_STORAGE_COMPONENT = "components/shared-storage"
# The label of the nodes that take training (roles/k3s/filter_plugins/k3s_nodes.py LABEL_TRAIN; a test keeps it).
TRAIN_NODE_LABEL = "dinops.io/train"


class WorkloadsError(ValueError):
    """A workloads setting that cannot be rendered; the message names the variable."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise WorkloadsError(message)


# --- The node ---------------------------------------------------------------------------------------------------
CLUSTERS = ("minikube", "k3s", "docker", "none")
# Binary and decimal suffixes of a Kubernetes quantity, in MiB.
_MI = {"": 1 / 2**20, "Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 2**20, "Pi": 2**30, "Ei": 2**40}
_MI |= {suffix: 1000**power / 2**20 for power, suffix in enumerate(("k", "M", "G", "T", "P", "E"), start=1)}


def quantity_mi(text: Any) -> int:
    """A memory quantity ("8G", "8Gi", "512Mi") in whole MiB, rounded up."""
    match = QUANTITY.match(str(text))
    _require(bool(match), f"not a memory quantity: {text!r}")
    number = float(str(text)[: match.start(2)] if match.group(2) else str(text))
    return int(-(-number * _MI[match.group(2) or ""] // 1))


def cpu_m(text: Any) -> int:
    """A CPU quantity ("2", "500m", "0.5") in millicores."""
    text = str(text)
    return int(text[:-1]) if text.endswith("m") else int(round(float(text) * 1000))


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


# --- What runs, and with which requests --------------------------------------------------------------------------
# The profile's workloads list names these; "inference" is the serve Deployment.
PROFILE_WORKLOADS = ("download", "train", "inference", "client")
# Requests and limits per pod: {cpu_m, memory_mi} requests, {cpu_m, memory_mi} limits. Fixed-size helpers first;
# serve by where it runs; train gets what is left, between its minimum and its wish, per training process.
HELPERS = {
    "download": {"requests": (500, 256), "limits": (2000, 1024)},
    "client": {"requests": (100, 128), "limits": (1000, 512)},
    "checkpoint": {"requests": (100, 128), "limits": (1000, 512)},
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
CHECKPOINT_JOB = "dinops-checkpoint"


def _fmt_cpu(m: int) -> str:
    return f"{m}m"


def _fmt_mem(mi: int) -> str:
    return f"{mi}Mi"


def _cluster_of(overlay: str) -> str:
    return {"k3s-gpu": "k3s", "docker-gpu": "docker"}.get(overlay, "minikube")


def site_plan(settings: dict[str, Any]) -> dict[str, Any]:
    """What the layer of one host runs and with which requests, from its profile and its node.

    Returns {apps: {app: bool} (download, train, serve, client, checkpoint), serve_device (gpu or cpu),
    train_processes, notes (what the role prints), resources ({app: {requests: {cpu, memory}, limits: {...}}}, empty
    when the node is unknown), nodes ({app: node} it was sized against)}. Raises WorkloadsError naming the profile
    and what is short when the pods cannot all fit.
    """
    overlay = settings["overlay"]
    profile = settings.get("profile") or "this host"
    cluster = settings.get("cluster") or _cluster_of(overlay)
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
    platform = platform_reserve(settings, trial_pods) if cluster not in ("docker", "none") else {}
    default_node = node_allocatable(node_settings, facts, platform)
    if default_node is None:
        notes.append("the cluster is not one the role built (workloads_cluster none): requests are the manifests'")
        return plan
    pinned = placement.get("requests_node") or {}
    # Apps pinned to the same node share it; the others share the host's node.
    groups: dict[str, list[str]] = {}
    nodes: dict[str, dict[str, Any]] = {}
    for app in ("download", "checkpoint", "client", "serve", "train"):
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
    node = node_allocatable(
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
            shm = quantity_mi(settings["shm_size"])
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
            "requests": {"cpu": _fmt_cpu(size["requests"][0]), "memory": _fmt_mem(size["requests"][1])},
            "limits": {"cpu": _fmt_cpu(size["limits"][0]), "memory": _fmt_mem(size["limits"][1])},
        }
        for app, size in sized.items()
    }


def _platform_pods(node: dict[str, Any]) -> str:
    pods = [f"{name} {pod['cpu_m']}m/{pod['memory_mi']}Mi" for name, pod in node["reserved"].items() if "/" in name]
    return ", ".join(pods) or "none"


# Where each app's pod template lives, for the patches.
APP_OBJECTS = {
    "download": ("batch/v1", "Job", DOWNLOAD_JOB, "download"),
    "train": ("batch/v1", "Job", TRAIN_JOB, "train"),
    "serve": ("apps/v1", "Deployment", "dinops-serve", "serve"),
    "client": ("apps/v1", "Deployment", "dinops-client", "client"),
    "checkpoint": ("batch/v1", "Job", CHECKPOINT_JOB, "download"),
}
# What goes when an app is not run: the workload and the Service in front of it.
APP_DELETIONS = {
    "download": [("batch/v1", "Job", DOWNLOAD_JOB)],
    "train": [("batch/v1", "Job", TRAIN_JOB)],
    "serve": [("apps/v1", "Deployment", "dinops-serve"), ("v1", "Service", "dinops-serve")],
    "client": [("apps/v1", "Deployment", "dinops-client"), ("v1", "Service", "dinops-client")],
}


def _resources_patch(app: str, resources: dict[str, Any]) -> dict[str, Any]:
    api, kind, name, container = APP_OBJECTS[app]
    patch = {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"containers": [{"name": container, "resources": resources}]}}},
    }
    return {"patch": json.dumps(patch)}


def _delete_patch(api: str, kind: str, name: str) -> dict[str, Any]:
    return {"patch": json.dumps({"$patch": "delete", "apiVersion": api, "kind": kind, "metadata": {"name": name}})}


def _train_patch(processes: int, gpus: int) -> dict[str, Any]:
    """Training on every GPU of the host: that many GPUs, one process each through torchrun (dinops.train.dist)."""
    container: dict[str, Any] = {"name": "train"}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: gpus}}
    if processes > 1:
        container["args"] = ["torchrun", "--standalone", f"--nproc-per-node={processes}", "-m", "dinops.train.main"]
    patch = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": TRAIN_JOB},
        "spec": {"template": {"spec": {"containers": [container]}}},
    }
    return {"patch": json.dumps(patch)}


def proxy_literals(proxy_env: dict[str, Any] | None, cluster: str, facts: dict[str, Any]) -> dict[str, str]:
    """HTTP(S)_PROXY and NO_PROXY, upper and lower case, for the pods that reach the internet. NO_PROXY adds the
    cluster's pod and service networks, in-cluster names and loopback (facts/cluster.yml) to the inventory's."""
    env = {str(k).lower(): str(v) for k, v in (proxy_env or {}).items() if v not in (None, "")}
    unknown = sorted(set(env) - {"http_proxy", "https_proxy", "no_proxy"})
    _require(not unknown, f"workloads_proxy_env has unknown keys {unknown}; use http_proxy, https_proxy, no_proxy")
    if not (env.get("http_proxy") or env.get("https_proxy")):
        return {}
    no_proxy = [p.strip() for p in env.get("no_proxy", "").split(",") if p.strip()]
    kind = facts.get(cluster) or {}
    for extra in [kind.get("pod_cidr"), kind.get("service_cidr"), *facts.get("no_proxy_always", [])]:
        if extra and extra not in no_proxy:
            no_proxy.append(extra)
    values = {key: env[key] for key in ("http_proxy", "https_proxy") if key in env}
    values["no_proxy"] = ",".join(no_proxy)
    return {name: value for key, value in values.items() for name in (key.upper(), key)}


def train_kind_components(settings: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The components of how training runs, relative to k8s/: the kind's (workloads_train_kind trainjob or
    pytorchjob) and Katib's (workloads_hpo), only when this host trains. Refuses, naming the setting, what cannot run:
    an unknown kind, several training pods as a batch Job, on a one-node cluster, on more nodes than take training
    (``cluster_nodes``: workloads_cluster_nodes, their TRAIN_NODE_LABEL) or without storage that every node mounts
    (a data server's NFS, or the ReadWriteMany claims of a k3s cluster of several nodes): each pod reads the dataset
    and rank 0 writes the checkpoints every pod resumes from."""
    kind = str(settings.get("train_kind") or "job")
    _require(kind in TRAIN_KINDS, f"workloads_train_kind must be one of {', '.join(TRAIN_KINDS)}, got {kind!r}")
    raw = settings.get("train_nodes", 1)
    _require(
        not isinstance(raw, bool) and str(raw).strip().isdigit() and int(raw) >= 1,
        f"workloads_train_nodes must be a whole number of training pods >= 1, got {raw!r}",
    )
    nodes = int(raw)
    if nodes > 1:
        _require(
            kind != "job",
            f"workloads_train_nodes is {nodes}, but a batch Job runs one training pod: set workloads_train_kind to "
            "trainjob or pytorchjob (Kubeflow Trainer or the Training Operator, dinops_platform)",
        )
        cluster = settings.get("cluster") or _cluster_of(settings["overlay"])
        _require(
            cluster not in ("minikube", "docker"),
            f"workloads_train_nodes is {nodes}, but a {cluster} cluster is one node and each training pod takes the "
            "profile's gpu_count GPUs: use a k3s cluster of several train hosts, or 1",
        )
        labelled = [n for n in settings.get("cluster_nodes") or [] if (n.get("labels") or {}).get(TRAIN_NODE_LABEL)]
        _require(
            cluster == "none" or len(labelled) >= nodes,
            f"workloads_train_nodes is {nodes}, but {len(labelled)} node(s) of the k3s cluster take training "
            f"(label {TRAIN_NODE_LABEL}; 'train' in gpu_profile.workloads): add train hosts or lower it",
        )
        placement = settings.get("placement") or {}
        shared = bool((settings.get("nfs") or {}).get("server")) or SHARED_STORAGE_COMPONENT in (
            placement.get("components") or []
        )
        _require(
            shared,
            f"workloads_train_nodes is {nodes}: the training pods on different nodes all read the dataset and resume "
            "from the checkpoints in the output volume, so both need storage every node mounts: a data server "
            "(inventory group data_servers, or workloads_nfs_server) or, on a k3s cluster of several nodes, "
            "workloads_shared_storage_class (a ReadWriteMany StorageClass)",
        )
    if not plan["apps"]["train"]:
        return []
    components = [TRAIN_KIND_COMPONENTS[kind]] if kind in TRAIN_KIND_COMPONENTS else []
    if settings.get("hpo"):
        components.append(HPO_COMPONENT)
    return components


def inference_service_component(settings: dict[str, Any], plan: dict[str, Any]) -> str:
    """The component of inference as a KServe InferenceService (workloads_inference_service), relative to k8s/;
    filter_plugins/inference_service.py folds the rendered Deployment dinops-serve into it. Refuses, naming the
    setting, what cannot be: the Docker runtime (no KServe), a profile without inference, a client URL of one's own
    (the component points the web client at KServe's Service dinops-predictor)."""
    cluster = settings.get("cluster") or _cluster_of(settings["overlay"])
    _require(
        cluster != "docker",
        "workloads_inference_service needs KServe on a Kubernetes cluster (the platform stage, platform_kserve); the "
        "Docker runtime runs the Deployment dinops-serve as a container: set it false with dinops_cluster docker",
    )
    _require(
        bool(plan["apps"]["serve"]),
        f"workloads_inference_service is true, but this host's profile ({settings.get('profile') or 'default'}) runs "
        "no inference: add inference to gpu_profile.workloads, or set it false",
    )
    client = ((settings.get("config") or {}).get("client") or {}).get("DINO_API_URL")
    _require(
        not client,
        f"workloads_config.client.DINO_API_URL ({client!r}) and workloads_inference_service both say where the web "
        "client calls inference; with the InferenceService it is KServe's Service http://dinops-predictor: drop one",
    )
    return ISVC_COMPONENT


def site_kustomization(settings: dict[str, Any]) -> dict[str, Any]:
    """Build the generated ``kustomization.yaml`` of one host, the layer on top of one overlay.

    ``settings`` keys: overlay, k8s_root (k8s/ relative to the layer's directory, default ..), demo (the CPU demo's
    synthetic dataset and short training),
    config ({app: {ENV: value}}), shm_size, storage_class (None keeps the overlay's), static_volumes, nfs
    ({server, paths, mount_options}: both volumes on an NFS export, see nfs_patches), s3 ({output, endpoint, serve,
    secret, region}: checkpoints and results in S3, see s3_config), ingress, client_public (login and TLS),
    gpu_sharing, train, checkpoint_url and checkpoint_sha256 (a checkpoint fetched into the output volume for
    inference), image_tag and image_registry (every image), images (per image, winning: {name: {name, tag}} or the
    images stage's {app: 'name:tag'}).
    What runs and how big (site_plan): cluster (minikube, k3s, none), profile (its name, for messages), workloads
    (the profile's list), download (optional override), node (node_allocatable's input; none: the manifests'
    requests stay), cluster_facts (facts/cluster.yml), proxy_env (http_proxy, https_proxy, no_proxy), placement
    ({components, patches, requests_node}: several k3s nodes).
    How training runs (train_kind_components): train_kind, train_nodes, hpo, cluster_nodes.
    """
    overlay = settings["overlay"]
    _require(overlay in OVERLAYS, f"workloads_overlay must be one of {', '.join(OVERLAYS)}, got {overlay!r}")
    sharing = settings.get("gpu_sharing", "exclusive")
    _require(sharing in GPU_SHARING, f"workloads_gpu_sharing must be one of {', '.join(GPU_SHARING)}, got {sharing!r}")
    shm_size = str(settings["shm_size"])
    _require(bool(QUANTITY.match(shm_size)), f"workloads_shm_size must be a quantity like 8Gi, got {shm_size!r}")

    plan = site_plan(settings)
    apps = plan["apps"]
    # The k8s/ tree, relative to the directory the layer is written to.
    root = str(settings.get("k8s_root") or "..").rstrip("/")
    components = []
    # One physical GPU cannot be limited to two pods without time-slicing: training takes it, inference uses CPU.
    if overlay in GPU_OVERLAYS and apps["serve"] and plan["serve_device"] == "cpu":
        components.append(f"{root}/components/serve-on-cpu")
    if settings.get("static_volumes"):
        components.append(f"{root}/components/static-pv")
    # The CPU demo: a synthetic dataset instead of COCO and a short training of a small model (k8s/components/demo).
    if settings.get("demo"):
        components.append(f"{root}/components/demo")
    # The ingress publishes the client on every node's 443 whatever the publish address: TLS ends at the controller
    # with the client's certificate and the client always logs users in, serving plain HTTP to the controller
    # (k8s/components/ingress, which takes the login from client-auth/login). Only k3s runs a controller (its packaged
    # Traefik, roles/k3s k3s_packaged_ingress); minikube here has no ingress addon and Docker has no controller.
    # Without it, a client published beyond loopback (dinops_publish_address) logs users in and serves TLS itself
    # (k8s/components/client-auth).
    if settings.get("ingress"):
        cluster = settings.get("cluster") or _cluster_of(overlay)
        _require(
            cluster == "k3s",
            f"workloads_ingress needs an ingress controller: k3s' packaged Traefik; dinops_cluster {cluster} has "
            "none. Leave workloads_ingress false and publish the client with dinops_publish_address (a login and "
            "TLS beyond loopback, docs/security.md)",
        )
        components.append(f"{root}/components/ingress")
    elif settings.get("client_public") and apps["client"]:
        components.append(f"{root}/{CLIENT_AUTH_COMPONENT}")
    nfs = settings.get("nfs") or {}
    if nfs.get("server"):
        _require(
            not settings.get("static_volumes"),
            "workloads_nfs_server and workloads_static_volumes both give the volumes; keep one (NFS for data that "
            "outlives the host, hostPath volumes for one node)",
        )
        _require(
            (settings.get("cluster") or _cluster_of(overlay)) != "docker",
            "workloads_nfs_server is a cluster setting: the Docker runtime uses host directories "
            "(workloads_docker_data_dir/<claim>); mount the NFS exports there with nfs_client_mounts "
            "(roles/nfs_client) and leave workloads_nfs_server empty",
        )
        components.append(f"{root}/{NFS_COMPONENT}")
    placement = settings.get("placement") or {}
    for component in placement.get("components") or []:
        components.append(f"{root}/{str(component).strip('/')}")
    components.extend(f"{root}/{c}" for c in train_kind_components(settings, plan))
    if settings.get("inference_service"):
        components.append(f"{root}/{inference_service_component(settings, plan)}")
    config = {app: dict(values or {}) for app, values in (settings.get("config") or {}).items()}
    s3 = settings.get("s3") or {}
    for app, values in s3_config(s3).items():
        config.setdefault(app, {}).update(values)
    if s3.get("secret"):
        components.append(f"{root}/{S3_COMPONENT}")
    # Inference loading its checkpoint from S3 reaches beyond the cluster; its NetworkPolicy allows only the client in
    # and DNS out otherwise (k8s/base/networkpolicy-serve.yaml).
    if s3.get("serve"):
        components.append(f"{root}/{S3_POLICY_COMPONENT}")
    checkpoint_url = settings.get("checkpoint_url") or ""
    if checkpoint_url:
        digest = str(settings.get("checkpoint_sha256") or "")
        _require(
            bool(re.match(r"^(https?|s3)://[^\s]+/[^/\s]+$", checkpoint_url)),
            f"workloads_checkpoint_url must be an http(s):// or s3:// URL of a file, got {checkpoint_url!r}",
        )
        _require(bool(SHA256.match(digest)), "workloads_checkpoint_sha256 must be the file's 64-digit sha256")
    _require(
        not (checkpoint_url and s3.get("serve")),
        "workloads_checkpoint_url and workloads_s3_serve both give inference its checkpoint; keep one",
    )
    if apps["checkpoint"]:
        components.append(f"{root}/components/checkpoint")
        filename = checkpoint_url.rsplit("/", 1)[1]
        config.setdefault("checkpoint-urls", {})["urls.txt"] = f"{checkpoint_url} sha256:{digest.lower()}"
        config.setdefault("serve", {})["DINO_CHECKPOINT"] = f"{CHECKPOINT_MOUNT}/pretrained/{filename}"
        config.setdefault("checkpoint", {})["DOWNLOAD_LOG_FORMAT"] = "json"
    # The pods that fetch from the internet go through the site's proxy, the cluster's own addresses do not.
    cluster = settings.get("cluster") or _cluster_of(overlay)
    proxies = proxy_literals(settings.get("proxy_env"), cluster, settings.get("cluster_facts") or {})
    for app in ("download", "checkpoint"):
        if proxies and apps[app]:
            config.setdefault(app, {}).update(proxies)

    generators = []
    for app, values in sorted(config.items()):
        _require(app in CONFIG_MAPS, f"workloads_config has unknown app {app!r}; apps are {', '.join(APPS)}")
        if values:
            literals = [f"{key}={_env_value(key, value)}" for key, value in sorted(values.items())]
            # The URL list is new in this layer; the apps' ConfigMaps exist in the base and are merged.
            behavior = "create" if app in LAYER_CONFIG_MAPS else "merge"
            generators.append({"name": CONFIG_MAPS[app], "behavior": behavior, "literals": literals})

    patches = []
    # What the profile does not run goes, with the Service in front of it.
    for app, objects in APP_DELETIONS.items():
        if not apps[app]:
            patches.extend(_delete_patch(*obj) for obj in objects)
    if apps["train"]:
        patches.append(_shm_patch(shm_size))
        if plan["train_gpus"] > 1 or plan["train_processes"] > 1:
            patches.append(_train_patch(plan["train_processes"], plan["train_gpus"]))
    # Requests sized from the node, so that everything that runs at the same time fits (site_plan).
    for app, resources in sorted(plan["resources"].items()):
        patches.append(_resources_patch(app, resources))
    patches.extend(placement.get("patches") or [])
    if nfs.get("server"):
        patches.extend(nfs_patches(nfs))
    if s3.get("serve") and apps["serve"]:
        # Inference downloads its checkpoint into /tmp (DINO_S3_CACHE_DIR empty): one in use and one during a
        # reload; a 4-scale R50 checkpoint with its optimizer state is about 0.75 GB, over the base's 1Gi.
        tmp = {"name": "tmp", "emptyDir": {"sizeLimit": S3_SERVE_TMP}}
        patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dinops-serve"},
                 "spec": {"template": {"spec": {"volumes": [tmp]}}}}  # fmt: skip
        patches.append({"patch": json.dumps(patch)})
    storage_class = settings.get("storage_class")
    if storage_class and not settings.get("static_volumes") and not nfs.get("server"):
        patches.append(
            {
                "target": {"kind": "PersistentVolumeClaim"},
                "patch": json.dumps([{"op": "add", "path": "/spec/storageClassName", "value": storage_class}]),
            }
        )

    images = []
    tag = settings.get("image_tag")
    registry = str(settings.get("image_registry") or "").rstrip("/")
    overrides = {_image_key(key): _image_ref(key, value) for key, value in (settings.get("images") or {}).items()}
    for name in IMAGES:
        default = {"name": f"{registry}/{name}" if registry else name, "tag": tag} if tag else None
        image = overrides.get(name) or default
        if image:
            _require(bool(TAG.match(str(image["tag"]))), f"image tag of {name} must be a Docker tag: {image['tag']!r}")
            images.append({"name": name, "newName": image.get("name", name), "newTag": str(image["tag"])})

    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"{root}/overlays/{overlay}"],
        # The base's namespace does not reach what this layer's components add (the checkpoint Job and its
        # ConfigMaps, the Ingress, the Kubeflow and KServe kinds): set it here for every namespaced object.
        "namespace": _namespace(settings.get("namespace") or "dinops"),
    }
    if components:
        kustomization["components"] = components
    if generators:
        kustomization["configMapGenerator"] = generators
    if patches:
        kustomization["patches"] = patches
    if images:
        kustomization["images"] = images
    return kustomization


def s3_config(s3: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The apps' settings for checkpoints and results in S3: {app: {ENV: value}}.

    ``s3`` keys: output (workloads_s3_output: s3://bucket/prefix, empty = off), endpoint (workloads_s3_endpoint:
    http(s) URL of an S3-compatible service, empty = AWS), serve (workloads_s3_serve: inference loads the latest
    checkpoint published there instead of the output volume's), region (workloads_s3_region, optional) and secret
    (the pods get the Secret dinops-s3).
    """
    output = str(s3.get("output") or "").strip()
    endpoint = str(s3.get("endpoint") or "").strip()
    if not output:
        _require(not s3.get("serve"), "workloads_s3_serve needs workloads_s3_output (the s3:// prefix training writes)")
        return {}
    _require(
        bool(S3_URL.match(output)),
        f"workloads_s3_output must be s3://bucket or s3://bucket/prefix (bucket: 3-63 lower-case letters, digits, "
        f"dots, hyphens), got {output!r}",
    )
    _require(
        not endpoint or bool(re.match(r"^https?://[^\s/]+(/[^\s]*)?$", endpoint)),
        f"workloads_s3_endpoint must be an http:// or https:// URL (or empty for AWS), got {endpoint!r}",
    )
    prefix = output.rstrip("/")
    config = {"train": {"DINO_OUTPUT_S3": prefix}}
    if s3.get("serve"):
        # A prefix ending in / means the latest checkpoint training published there (its manifest).
        config["serve"] = {"DINO_CHECKPOINT": prefix + "/"}
    if endpoint:
        for values in config.values():
            values["DINO_S3_ENDPOINT"] = endpoint
    region = str(s3.get("region") or "").strip()
    if region:
        # Not a secret: the region is a setting (boto3's AWS_DEFAULT_REGION), the Secret holds the credentials only.
        _require(bool(re.match(r"^[a-z0-9-]+$", region)), f"workloads_s3_region must be a region name, got {region!r}")
        for values in config.values():
            values["AWS_DEFAULT_REGION"] = region
    return config


# The keys of an AWS shared credentials file the workloads role writes (botocore reads aws_access_key_id,
# aws_secret_access_key and aws_session_token from a profile of that file: https://docs.aws.amazon.com/sdkref/latest/
# guide/file-format.html and https://boto3.amazonaws.com/v1/documentation/api/latest/guide/credentials.html).
AWS_CREDENTIALS_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


def aws_credentials_file(values: dict[str, Any]) -> str:
    """The [default] profile of an AWS shared credentials file (INI): the key `credentials` of the Secret dinops-s3.
    Empty keys are left out; a value is one line without surrounding blanks. The values are never in messages."""
    lines = ["[default]"]
    for key, value in (values or {}).items():
        _require(
            key in AWS_CREDENTIALS_KEYS, f"AWS credentials: {key!r} is not one of {', '.join(AWS_CREDENTIALS_KEYS)}"
        )
        text = str(value or "")
        _require("\n" not in text and "\r" not in text and text == text.strip(),
                 f"AWS credentials: the value of {key} must be one line without surrounding blanks")  # fmt: skip
        if text:
            lines.append(f"{key} = {text}")
    _require(len(lines) > 1, "AWS credentials: no value given")
    return "\n".join(lines) + "\n"


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def nfs_patches(nfs: dict[str, Any]) -> list[dict[str, Any]]:
    """The generated layer's patches of the NFS volumes: name (nfs_volume_name), server, exported path per claim and
    mount options, and each claim's volumeName.

    ``nfs`` keys: server (workloads_nfs_server: DNS name or address, no scheme, no port: NFSv4 uses 2049/tcp),
    paths ({dataset, output}: absolute exported paths, workloads_nfs_paths) and mount_options (a list, one option
    each, workloads_nfs_mount_options). kubelet passes the options to mount.nfs as they are and does not check
    them (https://kubernetes.io/docs/concepts/storage/persistent-volumes/#mount-options), so they are checked here.
    """
    server = str(nfs.get("server") or "").strip()
    _require(
        bool(NFS_SERVER.match(server)) or _is_address(server),
        f"workloads_nfs_server must be a host name or an address (no scheme, no port, no path), got {server!r}",
    )
    paths = nfs.get("paths") or {}
    _require(
        isinstance(paths, dict) and set(paths) == set(NFS_VOLUMES),
        f"workloads_nfs_paths must give exactly {', '.join(NFS_VOLUMES)}, got {paths!r}",
    )
    for claim, path in paths.items():
        text = str(path)
        _require(
            text.startswith("/") and text != "/" and ".." not in text.split("/") and " " not in text,
            f"workloads_nfs_paths.{claim} must be an absolute exported path below /, got {path!r}",
        )
    _require(
        len({str(p).rstrip("/") for p in paths.values()}) == len(paths),
        f"workloads_nfs_paths: the dataset and the output need their own exports, got {paths!r}",
    )
    options = nfs.get("mount_options") or []
    _require(
        isinstance(options, list) and all(isinstance(o, str) and NFS_OPTION.match(o) for o in options),
        f"workloads_nfs_mount_options must be a list of single mount options such as 'nfsvers=4.2', got {options!r}",
    )
    patches = []
    for claim, volume in NFS_VOLUMES.items():
        name = nfs_volume_name(claim, server, str(paths[claim]), options)
        ops = [
            {"op": "replace", "path": "/metadata/name", "value": name},
            {"op": "replace", "path": "/spec/nfs/server", "value": server},
            {"op": "replace", "path": "/spec/nfs/path", "value": str(paths[claim])},
            {"op": "replace", "path": "/spec/mountOptions", "value": list(options)},
        ]
        if not options:
            ops[-1] = {"op": "remove", "path": "/spec/mountOptions"}
        patches.append({"target": {"kind": "PersistentVolume", "name": volume}, "patch": json.dumps(ops)})
        # The claim binds exactly this volume, never a leftover of the same labels (tasks/volumes.yml removes those).
        bind = [{"op": "add", "path": "/spec/volumeName", "value": name}]
        patches.append(
            {"target": {"kind": "PersistentVolumeClaim", "name": f"dinops-{claim}"}, "patch": json.dumps(bind)}
        )
    return patches


def nfs_volume_name(claim: str, server: str, path: str, options: list[str]) -> str:
    """The NFS volume's name, derived from what its source says: a PersistentVolume's source is immutable
    ("spec.persistentvolumesource is immutable after creation", Kubernetes ValidatePersistentVolumeUpdate), so a
    new server address (a replaced data server), path or mount options make a new volume, and the role re-binds the
    claim to it (tasks/volumes.yml) instead of failing the apply or leaving pods on the dead address."""
    source = "\n".join([server, path.rstrip("/") or "/", ",".join(options)])
    return f"{NFS_VOLUMES[claim]}-{hashlib.sha256(source.encode()).hexdigest()[:10]}"


def _namespace(name: str) -> str:
    _require(
        bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", str(name))),
        f"workloads_namespace must be a Kubernetes namespace name (lower-case letters, digits, '-'), got {name!r}",
    )
    return str(name)


def _image_key(key: str) -> str:
    """The images stage names images by app ('serve'); the manifests by image ('dinops-serve')."""
    name = key if key.startswith("dinops-") else f"dinops-{key}"
    _require(name in IMAGES or name == "dinops-gpu-check", f"images has unknown image {key!r}")
    return name


def _image_ref(key: str, value: Any) -> dict[str, str]:
    """{'name', 'tag'} from such a dict or from a reference 'registry:5000/dinops-serve:TAG'."""
    if isinstance(value, dict):
        return {"name": str(value.get("name") or _image_key(key)), "tag": str(value["tag"])}
    repository, _, tag = str(value).rpartition(":")
    _require(bool(repository) and "/" not in tag, f"image {key} must be 'name:tag', got {value!r}")
    return {"name": repository, "tag": tag}


def _env_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    _require("\n" not in text, f"workloads_config value of {key} must be one line")
    return text


def _shm_patch(size: str) -> dict[str, Any]:
    volume = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    patch = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": TRAIN_JOB},
        "spec": {"template": {"spec": {"volumes": [volume]}}},
    }
    return {"patch": json.dumps(patch)}


def content_hash(value: Any) -> str:
    """SHA-256 of a JSON value in canonical form (sorted keys, no blanks): the same content, the same hash."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def template_hash(job: dict[str, Any]) -> str:
    return content_hash(job["spec"]["template"])


def prepare_objects(objects: list[dict[str, Any]], train: bool, download: bool = True) -> list[dict[str, Any]]:
    """Keep the training and download Jobs only when asked for; stamp every Job with its template's hash."""
    left_out = ({TRAIN_JOB} if not train else set()) | ({DOWNLOAD_JOB} if not download else set())
    prepared = []
    for obj in objects:
        if obj is None:
            continue
        if obj.get("kind") == "Job" and obj["metadata"]["name"] in left_out:
            continue
        if obj.get("kind") == "Job":
            obj = json.loads(json.dumps(obj))
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations[TEMPLATE_HASH_ANNOTATION] = template_hash(obj)
        prepared.append(obj)
    return prepared


# The kinds whose template the API server does not let change in place: the role stamps them with a hash of what
# they run and replaces them when it changes (TrainJob: CEL `self == oldSelf` on spec.trainer and spec.runtimeRef in
# the v2.3.0 CRD; a PyTorchJob's running pods do not follow a changed spec).
REPLACED_KINDS = ("Job", "TrainJob", "PyTorchJob")


def jobs_to_replace(desired: list[dict[str, Any]], live_jobs: list[dict[str, Any]]) -> list[str]:
    """Names of live Jobs (TrainJobs, PyTorchJobs) whose template differs from the desired one of the same kind (by
    the stamped hash). ``live_jobs``: what k8s_info returned, of one or several of REPLACED_KINDS (no kind: a Job)."""
    wanted = {
        (obj["kind"], obj["metadata"]["name"]): obj["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
        for obj in desired
        if obj.get("kind") in REPLACED_KINDS
    }
    stale = []
    for job in live_jobs:
        key = (job.get("kind", "Job"), job["metadata"]["name"])
        if key not in wanted:
            continue
        live_hash = (job["metadata"].get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
        if live_hash != wanted[key]:
            stale.append(key[1])
    return sorted(stale)


def job_outcome(resources: list[dict[str, Any]]) -> dict[str, str]:
    """Where a Job stands, from what k8s_info returned for it (``resources``, empty when it does not exist):
    ``state`` is complete, failed, running or missing; ``message`` says why.

    A Job that failed (backoffLimit reached, or a podFailurePolicy FailJob rule such as a bad setting) is reported
    at once, with the reason and message Kubernetes gives, instead of after the wait's timeout.
    """
    if not resources:
        return {"state": "missing", "message": "the Job does not exist"}
    job = resources[0]
    metadata = job.get("metadata", {})
    name = metadata.get("name", "?")
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    # FailureTarget comes before Failed while the last pods terminate; SuccessCriteriaMet before Complete.
    for kind in ("Failed", "FailureTarget"):
        if kind in conditions:
            reason = conditions[kind].get("reason") or "Failed"
            detail = conditions[kind].get("message") or "no message"
            namespace = metadata.get("namespace", "default")
            return {
                "state": "failed",
                "message": f"Job {name} failed ({reason}): {detail}. Its log: kubectl -n {namespace} logs job/{name}",
            }
    if "Complete" in conditions:
        return {"state": "complete", "message": f"Job {name} completed"}
    return {"state": "running", "message": f"Job {name} is running ({status.get('active', 0)} active pod(s))"}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_job_outcome": job_outcome,
            "dinops_site_kustomization": site_kustomization,
            "dinops_aws_credentials_file": aws_credentials_file,
            "dinops_site_plan": site_plan,
            "dinops_node_allocatable": node_allocatable,
            "dinops_prepare_objects": prepare_objects,
            "dinops_jobs_to_replace": jobs_to_replace,
        }
