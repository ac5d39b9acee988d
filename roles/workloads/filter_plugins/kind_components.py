"""How training and inference run as kinds of the Kubeflow and KServe platform: which components of k8s/ the layer
takes for workloads_train_kind (trainjob, pytorchjob), workloads_hpo (Katib) and workloads_inference_service
(KServe), and the refusals, naming the setting, of what cannot run (several training pods as a batch Job, on one
node, without shared storage; KServe on Docker or without inference). The objects themselves are folded after
kustomize by train_kinds.py and inference_service.py."""

from __future__ import annotations

import importlib.util
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
_sizing = _sibling("sizing")

# Inference as a KServe InferenceService (workloads_inference_service; filter_plugins/inference_service.py).
ISVC_COMPONENT = "components/inferenceservice"
# How training runs (workloads_train_kind): the batch Job, or a Kubeflow kind from its component, folded from the Job
# after kustomize (filter_plugins/train_kinds.py). HPO (workloads_hpo) adds the Katib Experiment's component.
TRAIN_KINDS = ("job", "trainjob", "pytorchjob")
TRAIN_KIND_COMPONENTS = {"trainjob": "components/trainjob", "pytorchjob": "components/pytorchjob"}
HPO_COMPONENT = "components/katib-experiment"
# The shared-storage component placement.py adds for a k3s cluster of several nodes (ReadWriteMany claims).
SHARED_STORAGE_COMPONENT = "components/shared-storage"
# The label of the nodes that take training (roles/k3s/filter_plugins/k3s_nodes.py LABEL_TRAIN; a test keeps it).
TRAIN_NODE_LABEL = "dinops.io/train"


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
        cluster = settings.get("cluster") or _sizing.cluster_of(settings["overlay"])
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
    cluster = settings.get("cluster") or _sizing.cluster_of(settings["overlay"])
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


class FilterModule:
    """No filter: the layer's choice of components (workloads.py); Ansible loads every file of filter_plugins."""

    def filters(self) -> dict[str, Any]:
        return {}
