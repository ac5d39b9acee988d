"""How much free disk this host's run needs under the Docker data root (pytest: tests/preflight/test_disk_need.py).

Filter:
  dinops_disk_check(host, plan, sizes_gb, min_free_gb=0, data_root="")
      -> {enough, needed_gb, items: [{what, gb}], summary, message}

``host`` is preflight's summary of the host (``disk_free_bytes``, ``disk_stored_bytes``, ``disk_mount``). ``plan``
says what this host's run stores, in the settings the later stages read (defaults/main.yml, preflight_disk_plan):

* every dinops image in this host's Docker, and a second copy where the images stage loads them (images_load, by
  default the cluster's runtime as in roles/images: the minikube node's Docker, k3s's containerd, or tarballs);
* minikube's node image and Kubernetes preload (cluster minikube);
* the air-gapped wheelhouse (images_mode airgap): the copy on this host, and the controller's build/wheelhouse when
  the controller is this host;
* the dataset, when this host fills the dataset volume (roles/workloads workloads_download: download in the profile's
  workloads, or training on a profile that trains) on a volume of its own: COCO at the peak of its extraction, or the
  CPU demo's synthetic shapes;
* Prometheus' time series (roles/workloads workloads_monitoring, on by default), when this host runs the workloads
  (any cluster but none, whatever the profile's workloads: the layer always holds Prometheus): its claim
  dinops-prometheus-data in full, which its retention keeps it within (roles/workloads/filter_plugins/monitoring.py),
  workloads_prometheus_volume_size when given, else the role's 10Gi or the CPU demo's 2Gi. The claim is on this
  host's disk on every runtime: minikube's hostpath volumes inside its node, k3s's local-path storage (on whichever
  node the scheduler picks, so every host of a k3s cluster counts it; the NFS data server holds only the dataset and
  the outputs), the Docker runtime's host directories.

Sizes are in GB of 10^9 bytes, as `docker images` and the documentation print them (preflight_disk_sizes_gb). The
free space plus what earlier runs already stored there must hold the estimate; with ``min_free_gb`` above 0 the free
space alone must hold that number instead.
"""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

CLUSTERS = ("minikube", "k3s", "docker", "none")
# Where roles/images loads the images: "" follows the cluster (its images_load default).
LOADS = ("", "minikube", "k3s", "tarball", "none")
IMAGES_MODES = ("pull", "airgap")
SIZES = ("images", "wheelhouse", "minikube_base", "coco", "demo", "prometheus", "prometheus_demo")
PLAN_KEYS = ("cluster", "images_load", "images_mode", "controller_is_host", "workloads", "train", "demo",
             "dataset_elsewhere", "monitoring", "prometheus_volume_size")  # fmt: skip
# A Kubernetes quantity as roles/workloads accepts workloads_prometheus_volume_size (filter_plugins/quantities.py
# QUANTITY, a subset of Kubernetes' grammar): a number with an optional binary or decimal suffix. The suffixes' values
# in bytes are Kubernetes' (kubernetes/apimachinery pkg/api/resource/quantity.go, the Quantity grammar: binarySI
# Ki Mi Gi Ti Pi Ei are powers of 2^10, decimalSI k M G T P E powers of 10^3; "1024 = 1Ki but 1000 = 1k").
QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
QUANTITY_BYTES = {"": 1} | {suffix: 1024**power for power, suffix in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)}
QUANTITY_BYTES |= {suffix: 1000**power for power, suffix in enumerate(("k", "M", "G", "T", "P", "E"), 1)}
SECOND_IMAGE_COPY = {
    "minikube": "the minikube node's Docker",
    "k3s": "k3s's containerd",
    "tarball": "the docker save archives",
}


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "yes", "1"):
        return True
    if str(value).strip().lower() in ("false", "no", "0", ""):
        return False
    raise AnsibleFilterError(f"preflight_disk_plan.{name} must be a boolean, got {value!r}")


def _choice(value: Any, choices: tuple[str, ...], name: str) -> str:
    text = str(value if value is not None else "").strip()
    if text not in choices:
        raise AnsibleFilterError(f"{name} must be one of {', '.join(c for c in choices if c)}, got {value!r}")
    return text


def _gb(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _sizes(sizes_gb: Any) -> dict[str, float]:
    if not isinstance(sizes_gb, dict):
        raise AnsibleFilterError(f"preflight_disk_sizes_gb must be a mapping, got {sizes_gb!r}")
    missing = [key for key in SIZES if key not in sizes_gb]
    if missing:
        raise AnsibleFilterError(
            f"preflight_disk_sizes_gb lacks {', '.join(missing)}: give every key ({', '.join(SIZES)}), "
            "since a dict in the inventory replaces the role's default whole"
        )
    try:
        return {key: float(sizes_gb[key]) for key in SIZES}
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(f"preflight_disk_sizes_gb: sizes are numbers of GB: {error}") from error


def quantity_gb(text: Any) -> float:
    """A Kubernetes quantity (10Gi, 50G, 512Mi) in GB of 10^9 bytes, to the nearest 0.1 as the sizes are given."""
    match = QUANTITY.match(str(text if text is not None else "").strip())
    if not match:
        raise AnsibleFilterError(
            "preflight_disk_plan.prometheus_volume_size (workloads_prometheus_volume_size) must be a Kubernetes "
            f"quantity like 10Gi, or empty for the role's default, got {text!r}"
        )
    return round(float(match.group(1)) * QUANTITY_BYTES[match.group(2) or ""] / 10**9, 1)


def prometheus(plan: dict[str, Any], sizes: dict[str, float]) -> dict[str, Any] | None:
    """Prometheus' claim on this host, as roles/workloads sizes it, or None when this host runs no Prometheus."""
    monitoring = _bool(plan["monitoring"], "monitoring")
    # Checked whether or not it is counted, as roles/workloads checks it whenever it renders the layer.
    given = str(plan["prometheus_volume_size"] if plan["prometheus_volume_size"] is not None else "").strip()
    gb = quantity_gb(given) if given else None
    if not monitoring or _choice(plan["cluster"], CLUSTERS, "preflight_disk_plan.cluster") == "none":
        return None
    what = "Prometheus' time series (its claim dinops-prometheus-data, "
    if gb is not None:
        return {"what": f"{what}workloads_prometheus_volume_size {given})", "gb": gb}
    if _bool(plan["demo"], "demo"):
        return {"what": f"{what}2Gi for the CPU demo)", "gb": sizes["prometheus_demo"]}
    return {"what": f"{what}10Gi by default)", "gb": sizes["prometheus"]}


def dataset(plan: dict[str, Any]) -> str:
    """What this host puts in the dataset volume on its own disk: coco, demo or none."""
    workloads = plan["workloads"]
    if not isinstance(workloads, list):
        raise AnsibleFilterError(f"preflight_disk_plan.workloads must be a list, got {workloads!r}")
    # roles/workloads/defaults/main.yml workloads_download.
    downloads = "download" in workloads or (_bool(plan["train"], "train") and "train" in workloads)
    cluster = _choice(plan["cluster"], CLUSTERS, "preflight_disk_plan.cluster")
    if not downloads or cluster == "none" or _bool(plan["dataset_elsewhere"], "dataset_elsewhere"):
        return "none"
    return "demo" if _bool(plan["demo"], "demo") else "coco"


def disk_items(plan: dict[str, Any], sizes_gb: dict[str, Any]) -> list[dict[str, Any]]:
    """What this host's run stores under the Docker data root at its peak, largest first."""
    if not isinstance(plan, dict) or any(key not in plan for key in PLAN_KEYS):
        raise AnsibleFilterError(f"preflight_disk_plan needs the keys {', '.join(PLAN_KEYS)}, got {plan!r}")
    sizes = _sizes(sizes_gb)
    cluster = _choice(plan["cluster"], CLUSTERS, "preflight_disk_plan.cluster")
    load = _choice(plan["images_load"], LOADS, "preflight_disk_plan.images_load") or (
        cluster if cluster in ("minikube", "k3s") else "none"
    )
    mode = _choice(plan["images_mode"], IMAGES_MODES, "preflight_disk_plan.images_mode")
    items = []
    if load in SECOND_IMAGE_COPY:
        items.append(
            {
                "what": f"the dinops images 2 x {_gb(sizes['images'])} GB (this host's Docker and "
                f"{SECOND_IMAGE_COPY[load]})",
                "gb": 2 * sizes["images"],
            }
        )
    else:
        items.append({"what": "the dinops images in this host's Docker", "gb": sizes["images"]})
    if cluster == "minikube":
        items.append({"what": "minikube's node image and Kubernetes preload", "gb": sizes["minikube_base"]})
    if mode == "airgap":
        if _bool(plan["controller_is_host"], "controller_is_host"):
            items.append(
                {
                    "what": f"the air-gapped wheelhouse 2 x {_gb(sizes['wheelhouse'])} GB (the controller's "
                    "build/wheelhouse, the controller being this host, and the images stage's copy)",
                    "gb": 2 * sizes["wheelhouse"],
                }
            )
        else:
            items.append({"what": "the air-gapped wheelhouse copied to this host", "gb": sizes["wheelhouse"]})
    data = dataset(plan)
    if data == "coco":
        items.append(
            {"what": "COCO 2017 while it is extracted (archives and images side by side)", "gb": sizes["coco"]}
        )
    elif data == "demo":
        items.append({"what": "the CPU demo's synthetic dataset", "gb": sizes["demo"]})
    claim = prometheus(plan, sizes)
    if claim:
        items.append(claim)
    return sorted(items, key=lambda item: -item["gb"])


def _remedies(plan: dict[str, Any], sizes_gb: dict[str, Any], short_gb: float) -> str:
    ways = [
        f"Grow the disk by at least {_gb(short_gb)} GB, or put Docker's data root on a larger volume "
        "(docker_data_root; preflight measures it)"
    ]
    if dataset(plan) == "coco":
        ways.append(
            "on a host that does not train, leave download out of its workloads (gpu_profile.workloads, or "
            "workloads_profile_workloads without a profile) so that COCO is not stored here"
        )
    if plan["images_mode"] == "airgap":
        ways.append("images_mode: pull stores no wheelhouse")
    if prometheus(plan, _sizes(sizes_gb)):
        ways.append(
            "a smaller workloads_prometheus_volume_size, or workloads_monitoring: false, stores less for Prometheus"
        )
    return "; ".join(ways) + ". preflight_min_disk_free_gb replaces this estimate (e.g. with the dataset elsewhere)."


def _shown(size_bytes: int) -> str:
    """GB rounded down, so that "20 GB free" never hides a shortfall."""
    return _gb(int(size_bytes / 10**8) / 10)


def disk_check(
    host: dict[str, Any], plan: dict[str, Any], sizes_gb: dict[str, Any], min_free_gb: Any = 0, data_root: str = ""
) -> dict[str, Any]:
    """Whether the disk under the Docker data root holds what this host's run stores, and what to say.

    What earlier runs stored there (``host['disk_stored_bytes']``: the images, the cluster, the dataset already in
    place) counts with the free space against the estimate, so a re-run passes on the disk the first run fitted in,
    although the dataset then takes less than at its peak. An explicit ``min_free_gb`` is free space alone.
    """
    try:
        free_bytes = int(host["disk_free_bytes"])
        stored_bytes = int(host.get("disk_stored_bytes") or 0)
        override = float(min_free_gb or 0)
    except (KeyError, TypeError, ValueError) as error:
        raise AnsibleFilterError(f"dinops_disk_check: free bytes and preflight_min_disk_free_gb: {error}") from error
    items = disk_items(plan, sizes_gb)
    estimate = round(sum(item["gb"] for item in items), 1)
    stores = ", ".join(f"{item['what']} {_gb(item['gb'])} GB" for item in items)
    have = f"{_shown(free_bytes)} GB free on {host.get('disk_mount', '?')} (the filesystem of "
    have += f"{data_root or 'the Docker data root'})"
    if override > 0:
        needed, available = override, free_bytes
        why = (
            f"preflight_min_disk_free_gb asks for {_gb(needed)} GB (this host's run would store about "
            f"{_gb(estimate)} GB: {stores})"
        )
    else:
        needed, available = estimate, free_bytes + stored_bytes
        if stored_bytes:
            have += f" and {_shown(stored_bytes)} GB already stored there by earlier runs (preflight_disk_stored_paths)"
        why = f"this host's run stores about {_gb(needed)} GB there at its peak: {stores}"
    short_bytes = round(needed * 10**9) - available
    enough = short_bytes <= 0
    message = f"{have}; {why}."
    if not enough and plan["cluster"] == "minikube":
        message += (
            " minikube turns off the kubelet's disk eviction, so a full disk stops Docker, etcd and the download "
            "together instead of failing cleanly."
        )
    if not enough:
        message += " " + _remedies(plan, sizes_gb, -(-short_bytes // 10**8) / 10)
    return {
        "enough": enough,
        "needed_gb": needed,
        "items": items,
        "summary": f"Disk: {have}, {_gb(needed)} GB needed",
        "message": message,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_disk_check": disk_check}
