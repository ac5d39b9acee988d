"""Preflight's free-disk check: the disk needed is what this host's run stores, not a fixed 20 GB (round2 F7).

The filter (roles/preflight/filter_plugins/dinops_disk.py) with the role's documented sizes; the role's task on the
shipped inventories is in test_disk_check_inventories.py.
"""

from __future__ import annotations

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from dinops_testing import REPO, load_plugin

disk = load_plugin("roles/preflight/filter_plugins/dinops_disk.py")
# roles/workloads' own sizing of Prometheus' claim, which preflight's sizes must follow.
monitoring = load_plugin("roles/workloads/filter_plugins/monitoring.py")
DEFAULTS = yaml.safe_load((REPO / "roles/preflight/defaults/main.yml").read_text())
SIZES = DEFAULTS["preflight_disk_sizes_gb"]
GB = 10**9

# The local inventory on a GPU VM: minikube, air-gapped images, the controller is the host, the default workloads.
GPU_VM = {
    "cluster": "minikube",
    "images_load": "",
    "images_mode": "airgap",
    "controller_is_host": True,
    "workloads": ["download", "train", "inference", "client"],
    "train": False,
    "demo": False,
    "dataset_elsewhere": False,
    "monitoring": True,
    "prometheus_volume_size": "",
}
# The same inventory on a host without GPU: the CPU demo on this host's Docker, with its synthetic dataset.
CPU_DEMO = {**GPU_VM, "cluster": "docker", "train": True, "demo": True}


def check(plan, free_gb, **kwargs):
    host = {"disk_free_bytes": int(free_gb * GB), "disk_mount": "/"}
    return disk.disk_check(host, plan, SIZES, data_root="/var/lib/docker", **kwargs)


def test_documented_sizes():
    """docs/images.md (images, wheelhouse), the download's archives, the audit's minikube figure, Prometheus' claims."""
    assert SIZES == {"images": 6.4, "wheelhouse": 3.0, "minikube_base": 2.5, "coco": 41, "demo": 0.1,
                     "prometheus": 10.7, "prometheus_demo": 2.1}  # fmt: skip


def test_prometheus_sizes_are_the_claims_roles_workloads_requests():
    """10Gi is 10.7 GB and the demo's 2Gi 2.1 GB: the role's sizes follow roles/workloads' defaults."""
    assert disk.quantity_gb(monitoring.VOLUME["default"]) == SIZES["prometheus"]
    assert disk.quantity_gb(monitoring.VOLUME["demo"]) == SIZES["prometheus_demo"]


def test_a_gpu_vm_on_the_local_inventory_needs_room_for_everything_it_stores():
    result = check(GPU_VM, 30)
    # COCO, the images twice (2 x 6.4), Prometheus' 10Gi claim, the wheelhouse twice, minikube: 73 GB.
    assert [item["gb"] for item in result["items"]] == [41, 12.8, 10.7, 6.0, 2.5]
    assert result["needed_gb"] == 73.0
    assert not result["enough"]
    message = result["message"]
    assert message.startswith(
        "30 GB free on / (the filesystem of /var/lib/docker); this host's run stores about 73 GB there at its peak:"
    )
    for part in (
        "COCO 2017 while it is extracted (archives and images side by side) 41 GB",
        "the dinops images 2 x 6.4 GB (this host's Docker and the minikube node's Docker) 12.8 GB",
        "Prometheus' time series (its claim dinops-prometheus-data, 10Gi by default) 10.7 GB",
        "the air-gapped wheelhouse 2 x 3 GB",
        "minikube's node image and Kubernetes preload 2.5 GB",
        "minikube turns off the kubelet's disk eviction",
        "Grow the disk by at least 43 GB, or put Docker's data root on a larger volume (docker_data_root",
        "leave download out of its workloads (gpu_profile.workloads, or workloads_profile_workloads",
        "images_mode: pull stores no wheelhouse",
        "a smaller workloads_prometheus_volume_size, or workloads_monitoring: false, stores less for Prometheus",
        "preflight_min_disk_free_gb replaces this estimate",
    ):
        assert part in message, part


def test_exactly_enough_passes_and_a_byte_less_does_not():
    needed = check(GPU_VM, 0)["needed_gb"]
    host = {"disk_free_bytes": int(needed * GB), "disk_mount": "/"}
    assert disk.disk_check(host, GPU_VM, SIZES)["enough"]
    host["disk_free_bytes"] -= 1
    assert not disk.disk_check(host, GPU_VM, SIZES)["enough"]


def test_the_cpu_demo_does_not_ask_for_coco_sized_space():
    result = check(CPU_DEMO, 15)
    assert result["enough"]
    # images once 6.4, wheelhouse twice 6, the demo's 2Gi Prometheus claim 2.1, synthetic shapes 0.1
    assert result["needed_gb"] == 14.6
    assert [item["what"] for item in result["items"]] == [
        "the dinops images in this host's Docker",
        "the air-gapped wheelhouse 2 x 3 GB (the controller's build/wheelhouse, the controller being this host, "
        "and the images stage's copy)",
        "Prometheus' time series (its claim dinops-prometheus-data, 2Gi for the CPU demo)",
        "the CPU demo's synthetic dataset",
    ]
    assert result["items"][2]["gb"] == 2.1
    assert result["summary"] == "Disk: 15 GB free on / (the filesystem of /var/lib/docker), 14.6 GB needed"


def test_monitoring_off_stores_no_prometheus():
    """workloads_monitoring false renders no Prometheus (roles/workloads): its claim is not counted, nor advised."""
    result = check({**GPU_VM, "monitoring": False}, 30)
    assert [item["gb"] for item in result["items"]] == [41, 12.8, 6.0, 2.5]  # 73 less Prometheus' 10.7
    assert result["needed_gb"] == 62.3
    assert "Prometheus" not in result["message"]
    assert check({**CPU_DEMO, "monitoring": "false"}, 0)["needed_gb"] == 12.5  # 14.6 less the demo's 2.1


@pytest.mark.parametrize(
    ("size", "gb"),
    [
        ("50Gi", 53.7),  # 50 x 2^30 bytes = 53.69 GB
        ("50G", 50),  # decimal suffix: 50 x 10^9 bytes
        ("1.5Ti", 1649.3),  # 1.5 x 2^40 bytes
        ("512Mi", 0.5),
        (" 20Gi ", 21.5),  # as roles/workloads reads it, stripped
    ],
)
def test_a_given_volume_size_is_counted_in_gb(size, gb):
    """workloads_prometheus_volume_size replaces the claim's default on every profile, the demo's too."""
    for plan in (GPU_VM, CPU_DEMO):
        result = check({**plan, "prometheus_volume_size": size}, 0)
        (item,) = [item for item in result["items"] if item["what"].startswith("Prometheus")]
        assert item == {
            "what": f"Prometheus' time series (its claim dinops-prometheus-data, "
            f"workloads_prometheus_volume_size {size.strip()})",
            "gb": gb,
        }


@pytest.mark.parametrize(
    ("change", "needed", "data"),
    [
        # rtx3060ti / t4 without download: inference and the client need no dataset; pull mode, no wheelhouse. The
        # images twice 12.8, minikube 2.5 and Prometheus 10.7, which runs whatever the workloads: 26 GB.
        ({"workloads": ["inference", "client"], "images_mode": "pull"}, 26.0, "none"),
        # Training asked for on a profile that trains fills the dataset even without download in the list: 73 GB as
        # the default workloads; without training the 41 GB of COCO are not stored: 32 GB.
        ({"workloads": ["train", "inference"], "train": True}, 73.0, "coco"),
        ({"workloads": ["train", "inference"], "train": False}, 32.0, "none"),
        # A remote controller keeps its build/wheelhouse on its own disk: 73 less 3.
        ({"controller_is_host": False}, 70.0, "coco"),
        # k3s: a second copy in containerd, no minikube base (73 less 2.5); on a data server's NFS the dataset is not
        # here (less 41), while Prometheus' claim stays on the node's local-path storage.
        ({"cluster": "k3s"}, 70.5, "coco"),
        ({"cluster": "k3s", "dataset_elsewhere": True}, 29.5, "none"),
        # The Docker runtime keeps one copy (73 less 6.4 and minikube's 2.5), unless the images are also written as
        # tarballs (a second 6.4).
        ({"cluster": "docker"}, 64.1, "coco"),
        ({"cluster": "docker", "images_load": "tarball"}, 70.5, "coco"),
        # A cluster of the user's: the workloads, their data and Prometheus run elsewhere; the images once 6.4 and the
        # wheelhouse twice 6.
        ({"cluster": "none"}, 12.4, "none"),
    ],
)
def test_what_is_counted_follows_the_plan(change, needed, data):
    plan = {**GPU_VM, **change}
    assert disk.dataset(plan) == data
    assert check(plan, 0)["needed_gb"] == needed


def test_a_rerun_counts_what_earlier_runs_stored():
    """After a run on a disk that held its peak, what is left free plus what the run stored holds the estimate,
    although the dataset takes less than at its peak (COCO's archives are gone)."""
    disk_size = 75 * GB
    # images twice, wheelhouse twice, minikube, the extracted COCO, Prometheus' first samples (its claim fills later)
    stored = int((12.8 + 6 + 2.5 + 21 + 0.1) * GB)
    host = {"disk_free_bytes": disk_size - stored, "disk_stored_bytes": stored, "disk_mount": "/"}
    result = disk.disk_check(host, GPU_VM, SIZES, data_root="/var/lib/docker")
    assert result["enough"]
    assert result["summary"] == (
        "Disk: 32.6 GB free on / (the filesystem of /var/lib/docker) and 42.4 GB already stored there by earlier "
        "runs (preflight_disk_stored_paths), 73 GB needed"
    )
    host["disk_free_bytes"] = 19 * GB
    result = disk.disk_check(host, GPU_VM, SIZES, data_root="/var/lib/docker")
    assert not result["enough"]
    assert result["message"].startswith(
        "19 GB free on / (the filesystem of /var/lib/docker) and 42.4 GB already stored there by earlier runs"
    )


def test_an_explicit_minimum_replaces_the_estimate():
    result = check(GPU_VM, 30, min_free_gb=25)
    assert result["enough"]
    assert result["needed_gb"] == 25
    # It is free space alone: what earlier runs stored does not count.
    host = {"disk_free_bytes": 30 * GB, "disk_stored_bytes": 80 * GB, "disk_mount": "/"}
    assert not disk.disk_check(host, GPU_VM, SIZES, min_free_gb=31)["enough"]
    result = check(GPU_VM, 30, min_free_gb=100)
    assert not result["enough"]
    assert "preflight_min_disk_free_gb asks for 100 GB (this host's run would store about 73 GB:" in result["message"]


@pytest.mark.parametrize(
    ("plan", "sizes", "error"),
    [
        ({**GPU_VM, "cluster": "kind"}, SIZES, "plan.cluster must be one of minikube, k3s, docker, none"),
        ({**GPU_VM, "images_mode": "offline"}, SIZES, "images_mode must be one of pull, airgap"),
        ({**GPU_VM, "workloads": "download"}, SIZES, "workloads must be a list"),
        ({"cluster": "minikube"}, SIZES, "preflight_disk_plan needs the keys"),
        (
            GPU_VM,
            {"coco": 45},
            "preflight_disk_sizes_gb lacks images, wheelhouse, minikube_base, demo, prometheus, prometheus_demo",
        ),
        # An inventory's dict of sizes from before Prometheus: named, not taken as 0.
        (
            GPU_VM,
            {key: value for key, value in SIZES.items() if key != "prometheus_demo"},
            "preflight_disk_sizes_gb lacks prometheus_demo:",
        ),
        (
            {key: value for key, value in GPU_VM.items() if key != "monitoring"},
            SIZES,
            "preflight_disk_plan needs the keys .*monitoring, prometheus_volume_size",
        ),
        ({**GPU_VM, "monitoring": "maybe"}, SIZES, r"preflight_disk_plan.monitoring must be a boolean, got 'maybe'"),
        (
            {**GPU_VM, "prometheus_volume_size": "ten"},
            SIZES,
            r"preflight_disk_plan.prometheus_volume_size \(workloads_prometheus_volume_size\) must be a Kubernetes "
            r"quantity like 10Gi, or empty for the role's default, got 'ten'",
        ),
        # Prometheus' own byte size (its retention.size form) is not a Kubernetes quantity.
        ({**GPU_VM, "prometheus_volume_size": "10GB"}, SIZES, "like 10Gi, or empty for the role's default, got '10GB'"),
    ],
)
def test_unusable_inputs_are_named(plan, sizes, error):
    with pytest.raises(AnsibleFilterError, match=error):
        disk.disk_check({"disk_free_bytes": 0, "disk_mount": "/"}, plan, sizes)
