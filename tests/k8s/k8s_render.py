"""Rendering helpers shared by the manifest tests (imported as k8s.k8s_render: pytest.ini puts tests/ on the path)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dinops_testing import load_plugin

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = ("cpu", "minikube-gpu", "k3s-gpu", "docker-gpu")
GPU_OVERLAYS = ("minikube-gpu", "k3s-gpu", "docker-gpu")
GPU = "nvidia.com/gpu"


def load_workloads_filters(name: str = "workloads"):
    """A filter plugin file of the workloads role (workloads.py, docker_runtime.py), imported as Ansible would."""
    return load_plugin(f"roles/workloads/filter_plugins/{name}.py")


def kustomize(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH; the manifest tests render with `kubectl kustomize`")
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    # libyaml's safe loader: the same documents as yaml.safe_load_all, parsed about ten times faster (75 ms -> 9 ms
    # for a site layer on the build machine), and the manifest tests render hundreds of layers.
    return [obj for obj in yaml.load_all(result.stdout, Loader=yaml.CSafeLoader) if obj]


def render_site(tmp_root: Path, name: str, settings: dict) -> list[dict]:
    """Render the generated top layer the workloads role writes, on a copy of k8s/ as on a host."""
    tree = tmp_root / name / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    kustomization = load_workloads_filters().site_kustomization(settings)
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return kustomize(tree / "site")


# Settings a host profile produces, one per path through the generated layer.
SITE_VARIANTS = {
    "rtx3090-training-exclusive": {
        "overlay": "minikube-gpu",
        "train": True,
        "gpu_sharing": "exclusive",
        "shm_size": "8Gi",
        "image_tag": "0.2.0-5f3a9c1e",
        "image_registry": "registry.local:5000/",
        "images": {"dinops-train": {"name": "registry.local/dinops-train", "tag": "abc123"}},
        "config": {"train": {"DINO_BATCH_SIZE": 4, "DINO_AMP": True}},
    },
    "rtx3060ti-inference": {
        "overlay": "k3s-gpu",
        "train": False,
        "gpu_sharing": "exclusive",
        "shm_size": "2Gi",
        "ingress": True,
        "checkpoint_url": "https://mirror.example/dino/checkpoint0011_4scale.pth",
        "checkpoint_sha256": "AB" * 32,
    },
    "time-slicing-training": {"overlay": "k3s-gpu", "train": True, "gpu_sharing": "time-slicing", "shm_size": "4Gi"},
    "cpu-static-volumes": {
        "overlay": "cpu",
        "train": True,
        "shm_size": "1Gi",
        "static_volumes": True,
        "storage_class": "ignored-with-static-volumes",
    },
    # Checkpoints and results in S3, inference loading them from there, credentials from the Secret dinops-s3.
    "cpu-s3-output": {
        "overlay": "cpu",
        "train": True,
        "shm_size": "1Gi",
        "s3": {
            "output": "s3://dinops-runs/coco/run-1",
            "endpoint": "http://10.0.1.5:9000",
            "serve": True,
            "secret": True,
        },  # fmt: skip
    },
    "cpu-storage-class": {"overlay": "cpu", "train": False, "shm_size": "512Mi", "storage_class": "fast-ssd"},
    "cpu-training-storage-class": {"overlay": "cpu", "train": True, "shm_size": "512Mi", "storage_class": "fast-ssd"},
    # The images stage's /etc/dinops/images.json: app -> reference, one content-hash tag per image.
    "images-stage-tags": {
        "overlay": "minikube-gpu",
        "train": True,
        "shm_size": "8G",
        "images": {
            "serve": "dinops-serve:0.1.0-3f2a",
            "train": "registry.local:5000/dinops-train:0.1.0-9c1d",
            "client": "dinops-client:0.1.0-77aa",
            "download": "dinops-download:0.1.0-0b0b",
            "gpu-check": "dinops-gpu-check:0.1.0-5e5e",
        },
    },
}


# --- The shipped GPU profiles, each on each cluster kind ---------------------------------------------------------
FACTS = yaml.safe_load((REPO / "facts" / "cluster.yml").read_text())
CLUSTER_OVERLAYS = {"minikube": "minikube-gpu", "k3s": "k3s-gpu", "docker": "docker-gpu"}


def shipped_profiles() -> dict[str, dict]:
    """Every gpu_profile of every inventory, by name."""
    profiles = {}
    for path in sorted(REPO.glob("inventories/*/group_vars/*.yml")):
        profile = (yaml.safe_load(path.read_text()) or {}).get("gpu_profile")
        if profile:
            profiles[profile["name"]] = profile
    return profiles


PROFILES = shipped_profiles()


def profile_node(profile: dict, cluster: str) -> dict:
    """The node settings the workloads role passes for a host of this profile (roles/workloads/defaults/main.yml)."""
    node = {
        "cluster": cluster,
        "profile": profile["name"],
        "host_vcpus": profile.get("host_vcpus"),
        "host_memory_mb": int(profile.get("host_memory_gb", 0)) * 1024,
        "gpu_count": profile.get("gpu_count", 1),
        "gpu_replicas": 2 if profile.get("gpu_sharing") == "time-slicing" else 1,
    }
    for key in ("cluster_cpus", "cluster_memory_mb"):
        if key in profile:
            node[key] = profile[key]
    return node


def profile_settings(profile: dict, cluster: str, train: bool) -> dict:
    """The settings render.yml passes to the site layer for a host of this profile (dinops_train = train)."""
    return {
        "overlay": CLUSTER_OVERLAYS[cluster],
        "cluster": cluster,
        "profile": profile["name"],
        "train": train,
        "workloads": list(profile["workloads"]),
        "gpu_sharing": profile.get("gpu_sharing", "exclusive"),
        "shm_size": profile["shm_size"],
        "node": profile_node(profile, cluster),
        "cluster_facts": FACTS,
        "config": {"train": {"DINO_BATCH_SIZE": profile["train_batch_size"]}},
    }


PROFILE_VARIANTS = {
    f"profile-{name}-{cluster}-{'train' if train else 'serve'}": profile_settings(profile, cluster, train)
    for name, profile in PROFILES.items()
    for cluster in CLUSTER_OVERLAYS
    for train in (True, False)
}
SITE_VARIANTS.update(PROFILE_VARIANTS)


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in ("Deployment", "Job")]


def container_env(objects: list[dict], container: dict) -> dict[str, str]:
    """Explicit env plus the keys of every ConfigMap the container takes through envFrom."""
    env = {item["name"]: item.get("value", "") for item in container.get("env", [])}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:  # a Secret's keys are not in the layer (k8s/components/s3-credentials)
            env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    return env


# --- The Docker runtime: the same layer, translated (roles/workloads/filter_plugins/docker_runtime.py) -------------
def docker_node(gpu_count: int = 0, vcpus: int = 2, memory_mb: int = 24105) -> dict:
    return {"cluster": "docker", "profile": "local", "host_vcpus": vcpus, "host_memory_mb": memory_mb,
            "gpu_count": gpu_count}  # fmt: skip


# What roles/workloads passes on a host of the Docker runtime (inventories/local on this machine: 2 vCPUs, no GPU,
# the demo), and the same runtime on GPU hosts.
DOCKER_VARIANTS = {
    "docker-cpu-demo": {"overlay": "cpu", "cluster": "docker", "demo": True, "train": True, "shm_size": "1G",
                        "node": docker_node(), "cluster_facts": FACTS,
                        "config": {"train": {"DINO_BATCH_SIZE": 2, "DINO_NUM_WORKERS": 2}}},
    "docker-cpu-serve-only": {"overlay": "cpu", "cluster": "docker", "train": False, "shm_size": "1G",
                              "node": docker_node(), "cluster_facts": FACTS},
    # A public client (dinops_publish_address not loopback): login and TLS from the Secret dinops-client-auth.
    "docker-cpu-public": {"overlay": "cpu", "cluster": "docker", "train": False, "shm_size": "1G",
                          "node": docker_node(), "cluster_facts": FACTS, "client_public": True},
    "docker-gpu-train-2": {"overlay": "docker-gpu", "cluster": "docker", "train": True, "shm_size": "8Gi",
                           "node": docker_node(gpu_count=2, vcpus=16, memory_mb=65536), "cluster_facts": FACTS,
                           "checkpoint_url": "https://mirror.example/dino/checkpoint0011_4scale.pth",
                           "checkpoint_sha256": "ab" * 32,
                           "proxy_env": {"https_proxy": "http://proxy.example:3128", "no_proxy": "intranet"}},
    "docker-gpu-serve": {"overlay": "docker-gpu", "cluster": "docker", "train": False, "shm_size": "8Gi",
                         "node": docker_node(gpu_count=1, vcpus=8, memory_mb=32768), "cluster_facts": FACTS},
}  # fmt: skip


# --- k3s across hosts: a train host and an inference host sharing the data server's NFS exports ------------------
WORKLOADS_DEFAULTS = yaml.safe_load((REPO / "roles" / "workloads" / "defaults" / "main.yml").read_text())
NFS_SETTINGS = {
    "server": "10.0.1.5",
    "paths": WORKLOADS_DEFAULTS["workloads_nfs_paths"],
    "mount_options": WORKLOADS_DEFAULTS["workloads_nfs_mount_options"],
}


def multinode_settings(train_profile: dict, serve_profile: dict, storage: str) -> dict:
    """What render.yml passes on the k3s server of a two-host cluster: the train host's profile (the playbook's host)
    with placement over both nodes; storage 'nfs' (a data server) or 'class' (workloads_shared_storage_class)."""
    placement_plugin = load_plugin("roles/workloads/filter_plugins/placement.py")
    k3s_nodes = load_plugin("roles/k3s/filter_plugins/k3s_nodes.py")
    nodes = []
    # The inference host takes inference and the client only (a machine's workloads, cloud_machines_list).
    hosts = (
        ("train-1", train_profile, list(train_profile["workloads"])),
        ("infer-1", serve_profile, [w for w in serve_profile["workloads"] if w in ("inference", "client")]),
    )
    for host, profile, taken in hosts:
        nodes.append(
            {
                "name": host,
                "labels": k3s_nodes.node_labels(profile.get("gpu_count", 1), taken),
                "gpu_count": profile.get("gpu_count", 1),
                "host_vcpus": profile["host_vcpus"],
                "host_memory_gb": float(profile["host_memory_gb"]),
                "workloads": taken,
            }
        )
    placement = placement_plugin.placement(
        nodes,
        {
            "shared_storage_class": "nfs-csi" if storage == "class" else "",
            "nfs": storage == "nfs",
            "train": True,
            "cluster_facts": FACTS,
        },
    )
    settings = profile_settings(train_profile, "k3s", True)
    settings["workloads"] = sorted({*train_profile["workloads"], *serve_profile["workloads"]})
    settings["placement"] = placement
    if storage == "nfs":
        settings["nfs"] = NFS_SETTINGS
    return settings


TRAIN_PROFILES = {n: p for n, p in PROFILES.items() if "train" in p["workloads"] and p.get("host_vcpus")}
SERVE_PROFILES = {n: p for n, p in PROFILES.items() if "inference" in p["workloads"] and p.get("host_vcpus")}
MULTINODE_VARIANTS = {
    f"multinode-{train}-{serve}-{storage}": multinode_settings(TRAIN_PROFILES[train], SERVE_PROFILES[serve], storage)
    for train in sorted(TRAIN_PROFILES)
    for serve in sorted(SERVE_PROFILES)[:1]
    for storage in ("nfs", "class")
}
SITE_VARIANTS.update(MULTINODE_VARIANTS)


# --- Training as a Kubeflow kind and the search (roles/workloads/filter_plugins/train_kinds.py) --------------------
HPO_DEFAULTS = {
    "enabled": True,
    **{key: WORKLOADS_DEFAULTS[f"workloads_hpo_{key}"]
       for key in ("algorithm", "max_trials", "parallel_trials", "max_failed_trials", "early_stopping", "parameters")},
}  # fmt: skip
# Name suffix -> (workloads_train_kind, workloads_hpo).
TRAIN_KIND_CHOICES = {
    "trainjob": ("trainjob", False),
    "pytorchjob": ("pytorchjob", False),
    "job-hpo": ("job", True),
    "trainjob-hpo": ("trainjob", True),
    "pytorchjob-hpo": ("pytorchjob", True),
}


def train_kind_variant(site: dict, kind: str, hpo: bool, nodes: int = 1, cluster_nodes: list | None = None) -> dict:
    """What render.yml passes for a host that trains as ``kind``: the site layer's settings and the fold's."""
    site = {**site, "train_kind": kind, "train_nodes": nodes, "hpo": hpo, "cluster_nodes": cluster_nodes or []}
    return {"site": site, "fold": {"kind": kind, "nodes": nodes, "cluster_nodes": cluster_nodes or [],
                                   "hpo": {**HPO_DEFAULTS, "enabled": hpo}}}  # fmt: skip


def render_train_kind(tmp_root: Path, name: str, variant: dict) -> list[dict]:
    """The objects render.yml keeps: the rendered layer, prepared, folded into the kind (the plan's processes and
    GPUs per node as render.yml passes them)."""
    sizing, jobs = load_workloads_filters("sizing"), load_workloads_filters("jobs")
    plan = sizing.site_plan(variant["site"])
    objects = jobs.prepare_objects(
        render_site(tmp_root, name, variant["site"]), plan["apps"]["train"], plan["apps"]["download"]
    )
    fold = {**variant["fold"], "processes": plan["train_processes"], "gpus": plan["train_gpus"]}
    return load_workloads_filters("train_kinds").train_kinds(objects, fold)


def train_cluster_settings(train_profile: dict, serve_profile: dict, storage: str) -> tuple[dict, list[dict]]:
    """A k3s cluster of two train hosts of ``train_profile`` and an inference host, its volumes on NFS ('nfs') or a
    ReadWriteMany class ('class'): (the server's site settings, workloads_cluster_nodes)."""
    placement_plugin = load_plugin("roles/workloads/filter_plugins/placement.py")
    k3s_nodes = load_plugin("roles/k3s/filter_plugins/k3s_nodes.py")
    hosts = [
        ("train-1", train_profile, list(train_profile["workloads"])),
        ("train-2", train_profile, list(train_profile["workloads"])),
        ("infer-1", serve_profile, [w for w in serve_profile["workloads"] if w in ("inference", "client")]),
    ]
    nodes = [{"name": host, "labels": k3s_nodes.node_labels(profile.get("gpu_count", 1), taken),
              "gpu_count": profile.get("gpu_count", 1), "host_vcpus": profile["host_vcpus"],
              "host_memory_gb": float(profile["host_memory_gb"]), "workloads": taken}
             for host, profile, taken in hosts]  # fmt: skip
    placement = placement_plugin.placement(
        nodes,
        {"shared_storage_class": "nfs-csi" if storage == "class" else "", "nfs": storage == "nfs", "train": True,
         "cluster_facts": FACTS},
    )  # fmt: skip
    settings = profile_settings(train_profile, "k3s", True)
    settings["workloads"] = sorted({*train_profile["workloads"], *serve_profile["workloads"]})
    settings["placement"] = placement
    if storage == "nfs":
        settings["nfs"] = NFS_SETTINGS
    return settings, nodes


TRAIN_KIND_VARIANTS = {
    f"kind-{name}-{cluster}-{suffix}": train_kind_variant(profile_settings(profile, cluster, True), kind, hpo)
    for name, profile in sorted(TRAIN_PROFILES.items())
    for cluster in ("minikube", "k3s")
    for suffix, (kind, hpo) in TRAIN_KIND_CHOICES.items()
}
TRAIN_KIND_VARIANTS.update(
    {
        f"kind-cpu-demo-{suffix}": train_kind_variant(
            {
                "overlay": "cpu",
                "cluster": "minikube",
                "demo": True,
                "train": True,
                "shm_size": "1Gi",
                "node": docker_node(vcpus=8, memory_mb=32768) | {"cluster": "minikube"},
                "cluster_facts": FACTS,
            },
            kind,
            hpo,
        )  # fmt: skip
        for suffix, (kind, hpo) in TRAIN_KIND_CHOICES.items()
    }
)


def plan_refuses(site: dict) -> bool:
    """Whether the role refuses this layer because its pods and the platform's cannot all fit on the node (a 4-vCPU
    minikube node has no room for Trainer's JobSet beside a search): tests/k8s/test_fit.py covers those refusals,
    the other tests take the layers the role applies."""
    sizing = load_workloads_filters("sizing")
    try:
        sizing.site_plan(site)
    except sizing.WorkloadsError as error:
        if "cannot all fit" in str(error):
            return True
        raise
    return False


def two_train_nodes_variant(train: str, storage: str, kind: str, hpo: bool) -> dict:
    """Training on both train hosts of train_cluster_settings (workloads_train_nodes 2)."""
    site, nodes = train_cluster_settings(TRAIN_PROFILES[train], SERVE_PROFILES["rtx3060ti"], storage)
    return train_kind_variant(site, kind, hpo, 2, nodes)


TRAIN_KIND_VARIANTS.update(
    {
        f"kind-2nodes-{train}-{storage}-{suffix}": two_train_nodes_variant(train, storage, kind, hpo)
        for train in ("a100", "rtx3090")
        for storage in ("nfs", "class")
        for suffix, (kind, hpo) in TRAIN_KIND_CHOICES.items()
        if kind != "job"
    }
)
TRAIN_KIND_VARIANTS = {name: v for name, v in TRAIN_KIND_VARIANTS.items() if not plan_refuses(v["site"])}
