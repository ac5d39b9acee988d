"""The generated top layer of one host: the inventory's overlay plus the host's GPU profile, as the
``kustomization.yaml`` the workloads role writes on top of k8s/. It puts together what the other files decide
(sizing.py: what runs and how big; kind_components.py: how training and inference run; storage_layer.py: NFS and
S3) as components, ConfigMap literals, patches and images, kept out of YAML so that pytest can check them without
a cluster.

``dinops_site_kustomization``  the generated top layer: the inventory's overlay plus the host's GPU profile.
"""

from __future__ import annotations

import importlib.util
import json
import re
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
_sizing = _sibling("sizing")
_kinds = _sibling("kind_components")
_storage = _sibling("storage_layer")
_jobs = _sibling("jobs")
_monitoring = _sibling("monitoring")

GPU_SHARING = ("exclusive", "time-slicing")
APPS = ("download", "train", "serve", "client")
# The generated ConfigMap each key of the config setting merges into.
CONFIG_MAPS = {app: f"dinops-{app}-config" for app in (*APPS, "checkpoint")} | {
    "checkpoint-urls": "dinops-checkpoint-urls"
}
# The ConfigMaps of the checkpoint component: new in the layer, not merged into the base's.
LAYER_CONFIG_MAPS = ("checkpoint-urls", "checkpoint")
IMAGES = ("dinops-download", "dinops-train", "dinops-serve", "dinops-client", "dinops-prometheus")
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
# Where the inference Deployment mounts the output volume (k8s/base/deployment-serve.yaml).
CHECKPOINT_MOUNT = "/models"
# A public web client: login and TLS from the Secret dinops-client-auth (docs/security.md).
CLIENT_AUTH_COMPONENT = "components/client-auth"


# Where each app's pod template lives, for the patches.
APP_OBJECTS = {
    "download": ("batch/v1", "Job", _jobs.DOWNLOAD_JOB, "download"),
    "train": ("batch/v1", "Job", _jobs.TRAIN_JOB, "train"),
    "serve": ("apps/v1", "Deployment", "dinops-serve", "serve"),
    "client": ("apps/v1", "Deployment", "dinops-client", "client"),
    "checkpoint": ("batch/v1", "Job", _jobs.CHECKPOINT_JOB, "download"),
    "prometheus": ("apps/v1", "Deployment", _monitoring.DEPLOYMENT, _monitoring.CONTAINER),
}
# What goes when an app is not run: the workload and the Service in front of it.
APP_DELETIONS = {
    "download": [("batch/v1", "Job", _jobs.DOWNLOAD_JOB)],
    "train": [("batch/v1", "Job", _jobs.TRAIN_JOB)],
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
        container["resources"] = {"limits": {_quantities.GPU_RESOURCE: gpus}}
    if processes > 1:
        container["args"] = ["torchrun", "--standalone", f"--nproc-per-node={processes}", "-m", "dinops.train.main"]
    patch = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": _jobs.TRAIN_JOB},
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


def site_kustomization(settings: dict[str, Any]) -> dict[str, Any]:
    """Build the generated ``kustomization.yaml`` of one host, the layer on top of one overlay.

    ``settings`` keys: overlay, k8s_root (k8s/ relative to the layer's directory, default ..), demo (the CPU demo's
    synthetic dataset and short training),
    config ({app: {ENV: value}}), shm_size, storage_class (None keeps the overlay's), static_volumes, nfs
    ({server, paths, mount_options}: both volumes on an NFS export, see nfs_patches), s3 ({output, endpoint, serve,
    secret, region}: checkpoints and results in S3, see s3_config), ingress, client_public (login and TLS),
    monitoring ({enabled, retention_time, retention_size, volume_size, dcgm_exporter_image}: see monitoring.py),
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
    _require(
        overlay in _sizing.OVERLAYS, f"workloads_overlay must be one of {', '.join(_sizing.OVERLAYS)}, got {overlay!r}"
    )
    sharing = settings.get("gpu_sharing", "exclusive")
    _require(sharing in GPU_SHARING, f"workloads_gpu_sharing must be one of {', '.join(GPU_SHARING)}, got {sharing!r}")
    shm_size = str(settings["shm_size"])
    _require(
        bool(_quantities.QUANTITY.match(shm_size)), f"workloads_shm_size must be a quantity like 8Gi, got {shm_size!r}"
    )

    plan = _sizing.site_plan(settings)
    apps = plan["apps"]
    # The k8s/ tree, relative to the directory the layer is written to.
    root = str(settings.get("k8s_root") or "..").rstrip("/")
    components = []
    # One physical GPU cannot be limited to two pods without time-slicing: training takes it, inference uses CPU.
    if overlay in _sizing.GPU_OVERLAYS and apps["serve"] and plan["serve_device"] == "cpu":
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
        cluster = settings.get("cluster") or _sizing.cluster_of(overlay)
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
            (settings.get("cluster") or _sizing.cluster_of(overlay)) != "docker",
            "workloads_nfs_server is a cluster setting: the Docker runtime uses host directories "
            "(workloads_docker_data_dir/<claim>); mount the NFS exports there with nfs_client_mounts "
            "(roles/nfs_client) and leave workloads_nfs_server empty",
        )
        components.append(f"{root}/{_storage.NFS_COMPONENT}")
    placement = settings.get("placement") or {}
    for component in placement.get("components") or []:
        components.append(f"{root}/{str(component).strip('/')}")
    components.extend(f"{root}/{c}" for c in _kinds.train_kind_components(settings, plan))
    if settings.get("inference_service"):
        components.append(f"{root}/{_kinds.inference_service_component(settings, plan)}")
    # Prometheus and, on a GPU cluster, NVIDIA's DCGM exporter (workloads_monitoring; filter_plugins/monitoring.py).
    monitoring = _monitoring.monitoring_layer(settings)
    components.extend(f"{root}/{c}" for c in monitoring["components"])
    config = {app: dict(values or {}) for app, values in (settings.get("config") or {}).items()}
    s3 = settings.get("s3") or {}
    for app, values in _storage.s3_config(s3).items():
        config.setdefault(app, {}).update(values)
    if s3.get("secret"):
        components.append(f"{root}/{_storage.S3_COMPONENT}")
    # Inference loading its checkpoint from S3 reaches beyond the cluster; its NetworkPolicy allows only the client in
    # and DNS out otherwise (k8s/base/networkpolicy-serve.yaml).
    if s3.get("serve"):
        components.append(f"{root}/{_storage.S3_POLICY_COMPONENT}")
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
    cluster = settings.get("cluster") or _sizing.cluster_of(overlay)
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
    patches.extend(monitoring["patches"])
    patches.extend(placement.get("patches") or [])
    if nfs.get("server"):
        patches.extend(_storage.nfs_patches(nfs))
    if s3.get("serve") and apps["serve"]:
        # Inference downloads its checkpoint into /tmp (DINO_S3_CACHE_DIR empty): one in use and one during a
        # reload; a 4-scale R50 checkpoint with its optimizer state is about 0.75 GB, over the base's 1Gi.
        tmp = {"name": "tmp", "emptyDir": {"sizeLimit": _storage.S3_SERVE_TMP}}
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
    images.extend(monitoring["images"])
    if images:
        kustomization["images"] = images
    return kustomization


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
        "metadata": {"name": _jobs.TRAIN_JOB},
        "spec": {"template": {"spec": {"volumes": [volume]}}},
    }
    return {"patch": json.dumps(patch)}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_site_kustomization": site_kustomization}
