"""Where the workloads run on a k3s cluster of several nodes, kept out of YAML so that pytest can check it.

``dinops_cluster_nodes``  the node list of the cluster, built from the inventory's hostvars.
``dinops_placement``      what the generated layer adds for that cluster: components, patches and the size of the
                          node each app is pinned to.

Node roles come from the k3s role's labels (roles/k3s/filter_plugins/k3s_nodes.py, imported from its file: one
rule for the labels the k3s role writes and the selectors used here). Volumes: k3s' local-path provisioner pins a
volume to the node of its first consumer (https://docs.k3s.io/storage), so with several nodes both claims need a
ReadWriteMany class (NFS or similar) that every node mounts; hostPath static volumes cannot span nodes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any


def _load(path: Path, name: str):
    """A filter plugin file as a module: Ansible loads each plugin file on its own, so siblings are read by path."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The node labels of the k3s role (one rule for both roles).
k3s_nodes = _load(Path(__file__).resolve().parents[2] / "k3s" / "filter_plugins" / "k3s_nodes.py", "dinops_k3s_nodes")
# The node budget (node_allocatable: a node's size minus k3s's pods and the kubelet's reservations), read once.
node_budget = _load(Path(__file__).resolve().with_name("node_budget.py"), "dinops_node_budget_for_placement")


# The apps each node role pins (k8s/base names). Download and train share the train nodes: the download fills
# the dataset where training reads it first. The client (CPU, a NodePort open on every node) runs anywhere.
PINNED = {
    "download": ("Job", "dinops-download", k3s_nodes.LABEL_TRAIN),
    "train": ("Job", "dinops-train", k3s_nodes.LABEL_TRAIN),
    "serve": ("Deployment", "dinops-serve", k3s_nodes.LABEL_INFERENCE),
}
API_VERSIONS = {"Job": "batch/v1", "Deployment": "apps/v1"}
CLAIMS = ("dinops-dataset", "dinops-output")
SHARED_STORAGE_COMPONENT = "components/shared-storage"


class PlacementError(ValueError):
    """A cluster layout that cannot be placed; the message names the variable to change."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise PlacementError(message)


def cluster_nodes(hostvars: dict[str, Any], hosts: list[str]) -> list[dict[str, Any]]:
    """One entry per k3s host: {name, labels, gpu_count, host_vcpus, host_memory_gb, workloads}.

    ``name`` is the Kubernetes node name, the host's nodename (k3s registers the hostname by default); sizes are
    the host's facts (processor_vcpus, memtotal_mb), GPUs what preflight found (ansible_local.dinops).
    """
    nodes = []
    for host in hosts:
        hostvar = hostvars[host]
        # ansible_facts (setup's names without the ansible_ prefix), or the injected ansible_* variables.
        facts = dict(hostvar.get("ansible_facts") or {}) or {
            key.removeprefix("ansible_"): value for key, value in hostvar.items() if key.startswith("ansible_")
        }
        local = (facts.get("local") or {}).get("dinops") or {}
        workloads = list((hostvar.get("gpu_profile") or {}).get("workloads") or [])
        gpu_count = int(local.get("gpu_count") or 0)
        nodes.append(
            {
                "name": str(facts.get("nodename") or host).lower(),
                "labels": k3s_nodes.node_labels(gpu_count, workloads),
                "gpu_count": gpu_count,
                "host_vcpus": int(facts.get("processor_vcpus") or 0),
                "host_memory_gb": round(int(facts.get("memtotal_mb") or 0) / 1024, 1),
                "workloads": workloads,
            }
        )
    return nodes


def placement(nodes: list[dict[str, Any]], settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The generated layer's additions for a k3s cluster of ``nodes`` (see cluster_nodes).

    ``settings`` keys: shared_storage_class (workloads_shared_storage_class: a ReadWriteMany class every node can
    mount), nfs (workloads_nfs_server is set: both volumes are static NFS volumes, ReadWriteMany),
    static_volumes (workloads_static_volumes), train and serve (whether those apps are deployed; default
    true), cluster_facts (facts/cluster.yml, workloads_cluster_facts) and gpu_replicas (time-slicing). One node (or
    none: minikube): nothing to add, local-path ReadWriteOnce works. Several nodes: the components and patches
    below, and ``requests_node`` {app: {cpu_m, memory_mi, gpus}}: what the smallest node the app may land on
    offers, its allocatable from node_budget.node_allocatable when cluster_facts is given (k3s's own pods counted on
    every node: the safe side), else the raw host size.
    """
    settings = settings or {}
    _require(isinstance(nodes, list), f"workloads_cluster_nodes must be a list, got {nodes!r}")
    if len(nodes) <= 1:
        return {}
    for node in nodes:
        _check_node(node)
    names = [node["name"] for node in nodes]
    _require(len(set(names)) == len(names), f"workloads_cluster_nodes has duplicate node names: {names}")
    _require(
        not settings.get("static_volumes"),
        f"workloads_static_volumes: hostPath volumes live on one node, and this k3s cluster has {len(nodes)} "
        "(" + ", ".join(names) + "). Turn it off and set workloads_shared_storage_class to a ReadWriteMany class.",
    )
    storage_class = str(settings.get("shared_storage_class") or "")
    nfs = bool(settings.get("nfs"))
    _require(
        bool(storage_class) or nfs,
        f"workloads_shared_storage_class and workloads_nfs_server are empty, but this k3s cluster has {len(nodes)} "
        "nodes (" + ", ".join(names) + "): k3s' local-path volumes stay on one node, so the dataset and the output "
        "need shared storage that every node mounts: a data server (inventory group data_servers, or "
        "workloads_nfs_server) or a ReadWriteMany StorageClass (for example nfs-csi from csi-driver-nfs).",
    )

    # Download needs a train node only when training runs; otherwise it may fill the shared volume anywhere.
    train = bool(settings.get("train", True))
    wanted = {"download": train, "train": train, "serve": bool(settings.get("serve", True))}
    sizes = _node_sizes(nodes, settings)
    patches = []
    requests_node = {}
    for app, (kind, name, label) in PINNED.items():
        candidates = [node for node in nodes if node["labels"].get(label) == "true"]
        if wanted[app]:
            _require(
                bool(candidates),
                f"{app} is pinned to nodes labelled {label}=true, and no host of the k3s cluster has it: add "
                f"'{'train' if label == k3s_nodes.LABEL_TRAIN else 'inference'}' to gpu_profile.workloads of one "
                "host in k3s_server or k3s_agent.",
            )
        if not candidates:
            continue
        patches.append(_node_selector_patch(kind, name, label))
        requests_node[app] = _smallest([sizes[node["name"]] for node in candidates])
    requests_node["client"] = _smallest(list(sizes.values()))
    if nfs:  # the NFS component's static volumes are ReadWriteMany already (site_kustomization adds it)
        return {"components": [], "patches": patches, "requests_node": requests_node}
    patches.append(
        {
            "target": {"kind": "PersistentVolumeClaim"},
            "patch": json.dumps([{"op": "add", "path": "/spec/storageClassName", "value": storage_class}]),
        }
    )
    return {"components": [SHARED_STORAGE_COMPONENT], "patches": patches, "requests_node": requests_node}


def _check_node(node: Any) -> None:
    _require(isinstance(node, dict), f"workloads_cluster_nodes entries must be dicts, got {node!r}")
    missing = [k for k in ("name", "labels", "gpu_count", "host_vcpus", "host_memory_gb") if k not in node]
    _require(not missing, f"workloads_cluster_nodes entry {node.get('name', node)!r} lacks {', '.join(missing)}")
    _require(isinstance(node["labels"], dict), f"workloads_cluster_nodes {node['name']}: labels must be a dict")
    for key in ("gpu_count", "host_vcpus", "host_memory_gb"):
        _require(
            isinstance(node[key], (int, float)) and not isinstance(node[key], bool) and node[key] >= 0,
            f"workloads_cluster_nodes {node['name']}: {key} must be a number >= 0, got {node[key]!r}",
        )


def _node_sizes(nodes: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, dict[str, int]]:
    facts = settings.get("cluster_facts")
    sizes = {}
    for node in nodes:
        raw = {
            "cpu_m": int(node["host_vcpus"] * 1000),
            "memory_mi": int(node["host_memory_gb"] * 1024),
            "gpus": int(node["gpu_count"]) * int(settings.get("gpu_replicas") or 1),
        }
        if facts:
            allocatable = node_budget.node_allocatable(
                {
                    "cluster": "k3s",
                    "profile": node["name"],
                    "host_vcpus": int(node["host_vcpus"]),
                    "host_memory_mb": int(node["host_memory_gb"] * 1024),
                    "gpu_count": int(node["gpu_count"]),
                    "gpu_replicas": int(settings.get("gpu_replicas") or 1),
                },
                facts,
            )
            raw = {key: int(allocatable[key]) for key in ("cpu_m", "memory_mi", "gpus")}
        sizes[node["name"]] = raw
    return sizes


def _smallest(sizes: list[dict[str, int]]) -> dict[str, int]:
    """What fits on every one of the nodes: a nodeSelector lets the scheduler choose any of them."""
    return {key: min(size[key] for size in sizes) for key in ("cpu_m", "memory_mi", "gpus")}


def _node_selector_patch(kind: str, name: str, label: str) -> dict[str, Any]:
    patch = {
        "apiVersion": API_VERSIONS[kind],
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"nodeSelector": {label: "true"}}}},
    }
    return {"patch": json.dumps(patch)}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_placement": placement, "dinops_cluster_nodes": cluster_nodes}
