"""Decisions of the workloads role, kept out of YAML so that pytest can check them without a cluster.

``dinops_site_kustomization``  the generated top layer: the inventory's overlay plus the host's GPU profile.
``dinops_prepare_objects``     the rendered objects to apply: training only when asked, Jobs stamped with a hash.
``dinops_jobs_to_replace``     Jobs whose pod template changed (a Job's template is immutable, so they are
                               deleted and created again; training then resumes from its checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

OVERLAYS = ("cpu", "minikube-gpu", "k3s-gpu")
GPU_OVERLAYS = ("minikube-gpu", "k3s-gpu")
GPU_SHARING = ("exclusive", "time-slicing")
APPS = ("download", "train", "serve", "client")
# The generated ConfigMap each key of the config setting merges into.
CONFIG_MAPS = {app: f"dinops-{app}-config" for app in APPS} | {"checkpoint-urls": "dinops-checkpoint-urls"}
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


class WorkloadsError(ValueError):
    """A workloads setting that cannot be rendered; the message names the variable."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise WorkloadsError(message)


def site_kustomization(settings: dict[str, Any]) -> dict[str, Any]:
    """Build the generated ``kustomization.yaml`` of one host, the layer on top of one overlay.

    ``settings`` keys: overlay, k8s_root (k8s/ relative to the layer's directory, default ..),
    config ({app: {ENV: value}}), shm_size, storage_class (None keeps the overlay's), static_volumes, ingress,
    gpu_sharing, train, checkpoint_url and checkpoint_sha256 (a checkpoint fetched into the output volume for
    inference), image_tag and image_registry (every image), images (per image, winning: {name: {name, tag}} or the
    images stage's {app: 'name:tag'}).
    """
    overlay = settings["overlay"]
    _require(overlay in OVERLAYS, f"workloads_overlay must be one of {', '.join(OVERLAYS)}, got {overlay!r}")
    sharing = settings.get("gpu_sharing", "exclusive")
    _require(sharing in GPU_SHARING, f"workloads_gpu_sharing must be one of {', '.join(GPU_SHARING)}, got {sharing!r}")
    shm_size = str(settings["shm_size"])
    _require(bool(QUANTITY.match(shm_size)), f"workloads_shm_size must be a quantity like 8Gi, got {shm_size!r}")

    # The k8s/ tree, relative to the directory the layer is written to.
    root = str(settings.get("k8s_root") or "..").rstrip("/")
    components = []
    # One physical GPU cannot be limited to two pods without time-slicing: training takes it, inference uses CPU.
    if overlay in GPU_OVERLAYS and settings.get("train") and sharing == "exclusive":
        components.append(f"{root}/components/serve-on-cpu")
    if settings.get("static_volumes"):
        components.append(f"{root}/components/static-pv")
    if settings.get("ingress"):
        components.append(f"{root}/components/ingress")
    config = {app: dict(values or {}) for app, values in (settings.get("config") or {}).items()}
    checkpoint_url = settings.get("checkpoint_url") or ""
    if checkpoint_url:
        digest = str(settings.get("checkpoint_sha256") or "")
        _require(
            bool(re.match(r"^(https?|s3)://[^\s]+/[^/\s]+$", checkpoint_url)),
            f"workloads_checkpoint_url must be an http(s):// or s3:// URL of a file, got {checkpoint_url!r}",
        )
        _require(bool(SHA256.match(digest)), "workloads_checkpoint_sha256 must be the file's 64-digit sha256")
        components.append(f"{root}/components/checkpoint")
        filename = checkpoint_url.rsplit("/", 1)[1]
        config.setdefault("checkpoint-urls", {})["urls.txt"] = f"{checkpoint_url} sha256:{digest.lower()}"
        config.setdefault("serve", {})["DINO_CHECKPOINT"] = f"{CHECKPOINT_MOUNT}/pretrained/{filename}"

    generators = []
    for app, values in sorted(config.items()):
        _require(app in CONFIG_MAPS, f"workloads_config has unknown app {app!r}; apps are {', '.join(APPS)}")
        if values:
            literals = [f"{key}={_env_value(key, value)}" for key, value in sorted(values.items())]
            # The URL list is new in this layer; the apps' ConfigMaps exist in the base and are merged.
            behavior = "create" if app == "checkpoint-urls" else "merge"
            generators.append({"name": CONFIG_MAPS[app], "behavior": behavior, "literals": literals})

    patches = [_shm_patch(shm_size)]
    storage_class = settings.get("storage_class")
    if storage_class and not settings.get("static_volumes"):
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
    }
    if components:
        kustomization["components"] = components
    if generators:
        kustomization["configMapGenerator"] = generators
    kustomization["patches"] = patches
    if images:
        kustomization["images"] = images
    return kustomization


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


def template_hash(job: dict[str, Any]) -> str:
    canonical = json.dumps(job["spec"]["template"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


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


def jobs_to_replace(desired: list[dict[str, Any]], live_jobs: list[dict[str, Any]]) -> list[str]:
    """Names of live Jobs whose template differs from the desired one (by the stamped hash)."""
    wanted = {
        obj["metadata"]["name"]: obj["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
        for obj in desired
        if obj.get("kind") == "Job"
    }
    stale = []
    for job in live_jobs:
        name = job["metadata"]["name"]
        if name not in wanted:
            continue
        live_hash = (job["metadata"].get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
        if live_hash != wanted[name]:
            stale.append(name)
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
            "dinops_prepare_objects": prepare_objects,
            "dinops_jobs_to_replace": jobs_to_replace,
        }
