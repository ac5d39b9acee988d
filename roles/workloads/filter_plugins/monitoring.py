"""Prometheus in the layer (workloads_monitoring, k8s/components/monitoring): whether it runs, which components the
layer takes for it (NVIDIA's DCGM exporter beside it on a GPU cluster), and its retention and volume, sized from the
profile and checked, as the patches the generated layer applies over the component's defaults.

Prometheus' flags, at the version the image installs (Debian bookworm's 2.42.0; prometheus/prometheus v2.42.0
cmd/prometheus/main.go and docs/storage.md):
- --storage.tsdb.retention.time is a duration of prometheus/common model.ParseDuration (v0.39.0, model/time.go):
  units y, w, d, h, m, s, ms, largest first, each at most once, whole numbers (``15d``, ``1w3d``, ``12h``).
- --storage.tsdb.retention.size is a byte size with a unit, B, KB, MB, GB, TB, PB or EB, "based on powers-of-2, so
  1KB is 1024B" (alecthomas/units Base2Bytes). Only persisted blocks are deleted to honour it, while the WAL and the
  head's chunks count in it: the volume needs room beyond it, so the size is held to 80 % of the claim.
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

COMPONENT = "components/monitoring"
# NVIDIA's DCGM exporter (a DaemonSet and the headless Service that prometheus.yml scrapes on 9400), by overlay: on
# minikube's one GPU node as it is; on k3s with its placement on the GPU nodes and the RuntimeClass nvidia (./k3s,
# listed after it); none on the Docker runtime, which runs no DaemonSet (k8s/components/dcgm-exporter).
DCGM_COMPONENTS = {
    "minikube-gpu": ["components/dcgm-exporter"],
    "k3s-gpu": ["components/dcgm-exporter", "components/dcgm-exporter/k3s"],
}
# The exporter's image as k8s/components/dcgm-exporter/daemonset.yaml names it (pinned there, with its source); the
# layer rewrites it to workloads_dcgm_exporter_image, a mirror's copy on air-gapped hosts.
DCGM_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter"
DEPLOYMENT = "dinops-prometheus"
CONTAINER = "prometheus"
CLAIM = "dinops-prometheus-data"
# The volume by what the layer runs: the CPU demo's few series over 15 days take some MB; a real run's trainer, API
# and DCGM exporter (some tens of series per GPU) at a 15 s interval take a few hundred MB over 15 days
# (docs/storage.md: about 1-2 bytes per sample). Both leave room for much longer runs.
VOLUME = {"demo": "2Gi", "default": "10Gi"}
RETENTION_TIME = "15d"
# Of the claim, what the blocks may take (retention.size); the rest is the WAL and the head's chunks.
RETENTION_SHARE = 0.8
MINIMUM_VOLUME_MI = 512
DURATION = re.compile(r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$")
BYTES = re.compile(r"^([0-9]+)(B|KB|MB|GB|TB|PB|EB)$")
_BYTES_MI = {"B": 1 / 2**20, "KB": 1 / 1024, "MB": 1, "GB": 1024, "TB": 2**20, "PB": 2**30, "EB": 2**40}


def monitoring_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The checked monitoring settings of a layer: {enabled, retention_time, retention_size (Prometheus' form, e.g.
    8192MB), volume_size (a Kubernetes quantity), dcgm_image (kustomize's images: entry for
    workloads_dcgm_exporter_image, or None)}. ``settings["monitoring"]``: {enabled (default true), retention_time,
    retention_size, volume_size, dcgm_exporter_image}, empty values sized from the profile (``settings["demo"]``)."""
    raw = settings.get("monitoring")
    raw = {} if raw is None else raw
    _require(isinstance(raw, dict), f"the monitoring settings must be a dict, got {raw!r}")
    enabled = raw.get("enabled", True)
    _require(isinstance(enabled, bool), f"workloads_monitoring must be true or false, got {enabled!r}")
    volume = str(raw.get("volume_size") or VOLUME["demo" if settings.get("demo") else "default"]).strip()
    _require(
        bool(_quantities.QUANTITY.match(volume)),
        f"workloads_prometheus_volume_size must be a Kubernetes quantity like 10Gi, got {volume!r}",
    )
    volume_mi = _quantities.quantity_mi(volume)
    _require(
        volume_mi >= MINIMUM_VOLUME_MI,
        f"workloads_prometheus_volume_size {volume} is under {MINIMUM_VOLUME_MI}Mi: too small for Prometheus' WAL",
    )
    retention_time = str(raw.get("retention_time") or RETENTION_TIME).strip()
    _require(
        bool(DURATION.match(retention_time)) and any(c.isdigit() and c != "0" for c in retention_time),
        f"workloads_prometheus_retention_time must be a Prometheus duration above 0 (units y, w, d, h, m, s, ms, "
        f"largest first: 15d, 1w3d, 12h), got {retention_time!r}",
    )
    largest = int(volume_mi * RETENTION_SHARE)
    retention_size = str(raw.get("retention_size") or f"{largest}MB").strip()
    match = BYTES.match(retention_size)
    _require(
        bool(match) and int(match.group(1)) > 0,
        "workloads_prometheus_retention_size must be a size with a unit, B, KB, MB, GB, TB, PB or EB (powers of 2, "
        f"as Prometheus reads it: 8GB), or empty for {int(RETENTION_SHARE * 100)} % of the volume; got "
        f"{retention_size!r}",
    )
    size_mi = int(match.group(1)) * _BYTES_MI[match.group(2)]
    _require(
        size_mi <= largest,
        f"workloads_prometheus_retention_size {retention_size} is more than {int(RETENTION_SHARE * 100)} % of "
        f"workloads_prometheus_volume_size {volume} ({largest}MB): the WAL and the head's chunks count in the size "
        "but are never deleted for it, so the volume would fill; lower it or grow the volume",
    )
    dcgm_image = str(raw.get("dcgm_exporter_image") or "").strip()
    dcgm_entry = None
    if dcgm_image:
        repository, _, tag = dcgm_image.rpartition(":")
        _require(
            bool(repository) and bool(tag) and "/" not in tag and "@" not in dcgm_image and " " not in dcgm_image,
            f"workloads_dcgm_exporter_image must be 'repository:tag' (a mirror's copy of {DCGM_IMAGE}), got "
            f"{dcgm_image!r}",
        )
        dcgm_entry = {"name": DCGM_IMAGE, "newName": repository, "newTag": tag}
    return {"enabled": enabled, "retention_time": retention_time, "retention_size": retention_size,
            "volume_size": volume, "dcgm_image": dcgm_entry}  # fmt: skip


def args(monitoring: dict[str, Any]) -> list[str]:
    """Prometheus' arguments in the Deployment (the image's ENTRYPOINT is tini -- /usr/bin/prometheus)."""
    return [
        "--config.file=/etc/prometheus/prometheus.yml",
        "--storage.tsdb.path=/prometheus",
        f"--storage.tsdb.retention.time={monitoring['retention_time']}",
        f"--storage.tsdb.retention.size={monitoring['retention_size']}",
        "--web.listen-address=:9090",
    ]


def monitoring_layer(settings: dict[str, Any]) -> dict[str, list]:
    """What the generated layer adds for Prometheus: {components (relative to k8s/), patches, images (kustomize's
    images: entries)}; nothing when it is off. On a GPU overlay of a cluster NVIDIA's DCGM exporter runs beside it
    (DCGM_COMPONENTS), its image rewritten to workloads_dcgm_exporter_image when that is set."""
    monitoring = monitoring_settings(settings)
    if not monitoring["enabled"]:
        return {"components": [], "patches": [], "images": []}
    dcgm = DCGM_COMPONENTS.get(settings["overlay"], [])
    components = [COMPONENT, *dcgm]
    images = [monitoring["dcgm_image"]] if dcgm and monitoring["dcgm_image"] else []
    container = {"name": CONTAINER, "args": args(monitoring)}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": DEPLOYMENT},
                  "spec": {"template": {"spec": {"containers": [container]}}}}  # fmt: skip
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
             "spec": {"resources": {"requests": {"storage": monitoring["volume_size"]}}}}  # fmt: skip
    return {"components": components, "patches": [{"patch": json.dumps(deployment)}, {"patch": json.dumps(claim)}],
            "images": images}  # fmt: skip


class FilterModule:
    """No filter: the layer's Prometheus (workloads.py); Ansible loads every file of filter_plugins."""

    def filters(self) -> dict[str, Any]:
        return {}
