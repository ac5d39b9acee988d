"""Placement of the workloads on a k3s cluster of several nodes (roles/workloads/filter_plugins/placement.py),
checked on its own and through kustomize on the k3s-gpu overlay."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from cluster.conftest import load_plugin
from k8s.k8s_render import K8S, find, kustomize, load_workloads_filters, pod_spec

placement_plugin = load_plugin("workloads", "placement")
k3s_nodes = load_plugin("k3s", "k3s_nodes")
placement = placement_plugin.placement
PlacementError = placement_plugin.PlacementError

TRAIN = {
    "name": "train-1",
    "gpu_count": 1,
    "host_vcpus": 16,
    "host_memory_gb": 64.0,
    "workloads": ["download", "train"],
}
INFER = {
    "name": "infer-1",
    "gpu_count": 1,
    "host_vcpus": 8,
    "host_memory_gb": 32.0,
    "workloads": ["inference", "client"],
}
CPU = {"name": "cpu-1", "gpu_count": 0, "host_vcpus": 4, "host_memory_gb": 15.5, "workloads": []}
SHARED = {"shared_storage_class": "nfs-csi"}


def node(spec: dict) -> dict:
    return {**spec, "labels": k3s_nodes.node_labels(spec["gpu_count"], spec["workloads"])}


def selectors(result: dict) -> dict[str, dict]:
    out = {}
    for entry in result["patches"]:
        patch = json.loads(entry["patch"])
        if isinstance(patch, dict):
            out[patch["metadata"]["name"]] = patch["spec"]["template"]["spec"]["nodeSelector"]
    return out


# --- Node labels (the k3s role's contract) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu_count", "workloads", "labels"),
    [
        (
            1,
            ["download", "train", "inference"],
            {"dinops.io/gpu": "true", "dinops.io/train": "true", "dinops.io/inference": "true"},
        ),
        (0, ["inference", "client"], {"dinops.io/inference": "true"}),
        ("2", ["train"], {"dinops.io/gpu": "true", "dinops.io/train": "true"}),
        (None, None, {}),
    ],
)
def test_node_labels_from_gpu_and_profile(gpu_count, workloads, labels):
    assert k3s_nodes.node_labels(gpu_count, workloads) == labels


def test_node_labels_never_use_kubelet_restricted_prefixes():
    # NodeRestriction rejects self-set kubernetes.io/ and k8s.io/ labels outside its allow-list.
    for key in k3s_nodes.MANAGED_LABELS:
        prefix = key.split("/")[0]
        assert not prefix.endswith(("kubernetes.io", "k8s.io")), key


@pytest.mark.parametrize(("gpu_count", "workloads"), [("many", []), (-1, []), (1, "train")])
def test_node_labels_refuse_bad_facts(gpu_count, workloads):
    with pytest.raises(k3s_nodes.K3sNodesError, match="gpu_count|gpu_profile.workloads"):
        k3s_nodes.node_labels(gpu_count, workloads)


def test_label_args_remove_labels_a_host_no_longer_asks_for():
    args = k3s_nodes.node_label_args({"dinops.io/inference": "true"})
    assert args == ["dinops.io/inference=true", "dinops.io/gpu-", "dinops.io/train-"]
    assert k3s_nodes.config_node_labels({"dinops.io/train": "true", "dinops.io/gpu": "true"}) == [
        "dinops.io/gpu=true",
        "dinops.io/train=true",
    ]


# --- The node list from hostvars -------------------------------------------------------------------------------


def test_cluster_nodes_from_hostvars():
    hostvars = {
        "train-1": {
            "ansible_facts": {
                "nodename": "Train-1",
                "processor_vcpus": 16,
                "memtotal_mb": 65536,
                "local": {"dinops": {"gpu_count": 2}},
            },
            "gpu_profile": {"workloads": ["download", "train"]},
        },
        "cpu-1": {"ansible_processor_vcpus": 4, "ansible_memtotal_mb": 15872},
    }
    nodes = placement_plugin.cluster_nodes(hostvars, ["train-1", "cpu-1"])
    assert nodes == [
        {
            "name": "train-1",
            "labels": {"dinops.io/gpu": "true", "dinops.io/train": "true"},
            "gpu_count": 2,
            "host_vcpus": 16,
            "host_memory_gb": 64.0,
            "workloads": ["download", "train"],
        },
        {"name": "cpu-1", "labels": {}, "gpu_count": 0, "host_vcpus": 4, "host_memory_gb": 15.5, "workloads": []},
    ]


# --- Placement decisions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [[], [node(TRAIN)]])
def test_one_node_or_minikube_adds_nothing(nodes):
    assert placement(nodes, {}) == {}


def test_several_nodes_pin_apps_and_share_storage():
    result = placement([node(TRAIN), node(INFER), node(CPU)], SHARED)
    assert result["components"] == ["components/shared-storage"]
    assert selectors(result) == {
        "dinops-download": {"dinops.io/train": "true"},
        "dinops-train": {"dinops.io/train": "true"},
        "dinops-serve": {"dinops.io/inference": "true"},
    }
    claims = [p for p in result["patches"] if p.get("target") == {"kind": "PersistentVolumeClaim"}]
    assert [json.loads(p["patch"]) for p in claims] == [
        [{"op": "add", "path": "/spec/storageClassName", "value": "nfs-csi"}]
    ]
    assert result["requests_node"] == {
        "download": {"cpu_m": 16000, "memory_mi": 65536, "gpus": 1},
        "train": {"cpu_m": 16000, "memory_mi": 65536, "gpus": 1},
        "serve": {"cpu_m": 8000, "memory_mi": 32768, "gpus": 1},
        # The client may land anywhere: the smallest node.
        "client": {"cpu_m": 4000, "memory_mi": 15872, "gpus": 0},
    }


def test_several_candidate_nodes_size_for_the_smallest():
    big = {**TRAIN, "name": "train-2", "host_vcpus": 32, "host_memory_gb": 128.0, "gpu_count": 4}
    result = placement([node(TRAIN), node(big), node(INFER)], SHARED)
    assert result["requests_node"]["train"] == {"cpu_m": 16000, "memory_mi": 65536, "gpus": 1}


def test_requests_node_is_the_allocatable_when_cluster_facts_are_given():
    facts = yaml.safe_load((K8S.parent / "facts" / "cluster.yml").read_text())
    result = placement([node(TRAIN), node(INFER)], {**SHARED, "cluster_facts": facts, "gpu_replicas": 2})
    allocatable = load_workloads_filters("node_budget").node_allocatable(
        {"cluster": "k3s", "host_vcpus": 8, "host_memory_mb": 32768, "gpu_count": 1, "gpu_replicas": 2}, facts
    )
    assert result["requests_node"]["serve"] == {k: allocatable[k] for k in ("cpu_m", "memory_mi", "gpus")}
    # k3s's own pods and the eviction threshold come off the raw size; time-slicing doubles the GPUs.
    assert result["requests_node"]["serve"]["cpu_m"] < 8000
    assert result["requests_node"]["serve"]["memory_mi"] < 32768
    assert result["requests_node"]["serve"]["gpus"] == 2


def test_several_nodes_without_shared_storage_fail_naming_the_variable():
    with pytest.raises(PlacementError, match="workloads_shared_storage_class and workloads_nfs_server.*ReadWriteMany"):
        placement([node(TRAIN), node(INFER)], {"shared_storage_class": ""})


def test_several_nodes_with_a_data_server_need_no_storage_class():
    # The NFS component's static volumes are ReadWriteMany: no class, no claim patch, the node selectors stay.
    result = placement([node(TRAIN), node(INFER)], {"shared_storage_class": "", "nfs": True})
    assert result["components"] == []
    assert not [p for p in result["patches"] if p.get("target") == {"kind": "PersistentVolumeClaim"}]
    assert selectors(result)["dinops-train"] == {"dinops.io/train": "true"}


def test_static_volumes_refused_on_several_nodes():
    with pytest.raises(PlacementError, match="workloads_static_volumes"):
        placement([node(TRAIN), node(INFER)], {**SHARED, "static_volumes": True})


def test_missing_train_node_is_refused_when_training():
    with pytest.raises(PlacementError, match="dinops.io/train.*gpu_profile.workloads"):
        placement([node(INFER), node(CPU)], {**SHARED, "train": True})
    # Without training, serving alone is placed and download/train stay unpinned.
    result = placement([node(INFER), node(CPU)], {**SHARED, "train": False})
    assert set(selectors(result)) == {"dinops-serve"}


def test_missing_inference_node_is_refused():
    with pytest.raises(PlacementError, match="dinops.io/inference"):
        placement([node(TRAIN), node(CPU)], SHARED)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ("train-1", "must be a list"),
        ([node(TRAIN), {"name": "x"}], "lacks labels"),
        ([node(TRAIN), {**node(INFER), "host_vcpus": "8"}], "host_vcpus must be a number"),
        ([node(TRAIN), node(TRAIN)], "duplicate node names"),
    ],
)
def test_bad_node_lists_are_refused(nodes, message):
    with pytest.raises(PlacementError, match=message):
        placement(nodes, SHARED)


# --- Through kustomize: the k3s-gpu overlay with the placement ---------------------------------------------


def render_with_placement(tmp_path, result: dict) -> list[dict]:
    """The generated layer on a copy of k8s/, with the placement appended as the workloads role does."""
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    settings = {"overlay": "k3s-gpu", "train": True, "gpu_sharing": "exclusive", "shm_size": "8Gi"}
    kustomization = load_workloads_filters().site_kustomization({**settings, "placement": result})
    components = [f"../{c}" for c in result["components"]]
    # The workloads filter appends the placement (once it knows the setting); add it here when it does not yet.
    if not set(components) <= set(kustomization.get("components", [])):
        kustomization.setdefault("components", []).extend(components)
        kustomization["patches"].extend(result["patches"])
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return kustomize(tree / "site")


def test_k3s_gpu_overlay_renders_node_selectors_and_shared_claims(tmp_path):
    objects = render_with_placement(tmp_path, placement([node(TRAIN), node(INFER)], SHARED))
    assert pod_spec(find(objects, "Job", "dinops-train"))["nodeSelector"] == {"dinops.io/train": "true"}
    assert pod_spec(find(objects, "Job", "dinops-download"))["nodeSelector"] == {"dinops.io/train": "true"}
    assert pod_spec(find(objects, "Deployment", "dinops-serve"))["nodeSelector"] == {"dinops.io/inference": "true"}
    assert "nodeSelector" not in pod_spec(find(objects, "Deployment", "dinops-client"))
    # The GPU overlay's own settings survive the placement.
    assert pod_spec(find(objects, "Job", "dinops-train"))["runtimeClassName"] == "nvidia"
    for claim in ("dinops-dataset", "dinops-output"):
        spec = find(objects, "PersistentVolumeClaim", claim)["spec"]
        assert spec["accessModes"] == ["ReadWriteMany"]
        assert spec["storageClassName"] == "nfs-csi"


def test_k3s_gpu_overlay_without_placement_keeps_local_path(tmp_path):
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    objects = kustomize(tree / "overlays" / "k3s-gpu")
    for claim in ("dinops-dataset", "dinops-output"):
        spec = find(objects, "PersistentVolumeClaim", claim)["spec"]
        assert spec["accessModes"] == ["ReadWriteOnce"]
        assert spec["storageClassName"] == "local-path"
    assert "nodeSelector" not in pod_spec(find(objects, "Job", "dinops-train"))


def test_static_volumes_need_the_directories_the_k3s_role_creates():
    # DirectoryOrCreate would let kubelet create them root:root 0755, unwritable for uid 10001.
    for name in ("pv-dataset.yaml", "pv-output.yaml"):
        pv = yaml.safe_load((K8S / "components" / "static-pv" / name).read_text())
        assert pv["spec"]["hostPath"]["type"] == "Directory"
        assert pv["spec"]["hostPath"]["path"].startswith("/srv/dinops/")
