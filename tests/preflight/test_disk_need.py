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
}
# The same inventory on a host without GPU: the CPU demo on this host's Docker, with its synthetic dataset.
CPU_DEMO = {**GPU_VM, "cluster": "docker", "train": True, "demo": True}


def check(plan, free_gb, **kwargs):
    host = {"disk_free_bytes": int(free_gb * GB), "disk_mount": "/"}
    return disk.disk_check(host, plan, SIZES, data_root="/var/lib/docker", **kwargs)


def test_documented_sizes():
    """docs/images.md (images, wheelhouse), the download's archives, the audit's minikube figure."""
    assert SIZES == {"images": 6.3, "wheelhouse": 3.0, "minikube_base": 2.5, "coco": 41, "demo": 0.1}


def test_a_gpu_vm_on_the_local_inventory_needs_room_for_everything_it_stores():
    result = check(GPU_VM, 30)
    assert [item["gb"] for item in result["items"]] == [41, 12.6, 6.0, 2.5]
    assert result["needed_gb"] == 62.1
    assert not result["enough"]
    message = result["message"]
    assert message.startswith(
        "30 GB free on / (the filesystem of /var/lib/docker); this host's run stores about 62.1 GB there at its peak:"
    )
    for part in (
        "COCO 2017 while it is extracted (archives and images side by side) 41 GB",
        "the dinops images 2 x 6.3 GB (this host's Docker and the minikube node's Docker) 12.6 GB",
        "the air-gapped wheelhouse 2 x 3 GB",
        "minikube's node image and Kubernetes preload 2.5 GB",
        "minikube turns off the kubelet's disk eviction",
        "Grow the disk by at least 32.1 GB, or put Docker's data root on a larger volume (docker_data_root",
        "leave download out of its workloads (gpu_profile.workloads, or workloads_profile_workloads",
        "images_mode: pull stores no wheelhouse",
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
    assert result["needed_gb"] == 12.4  # images once 6.3, wheelhouse twice 6, synthetic shapes 0.1
    assert [item["what"] for item in result["items"]] == [
        "the dinops images in this host's Docker",
        "the air-gapped wheelhouse 2 x 3 GB (the controller's build/wheelhouse, the controller being this host, "
        "and the images stage's copy)",
        "the CPU demo's synthetic dataset",
    ]
    assert result["summary"] == "Disk: 15 GB free on / (the filesystem of /var/lib/docker), 12.4 GB needed"


@pytest.mark.parametrize(
    ("change", "needed", "data"),
    [
        # rtx3060ti / t4 without download: inference and the client need no dataset; pull mode, no wheelhouse.
        ({"workloads": ["inference", "client"], "images_mode": "pull"}, 15.1, "none"),
        # Training asked for on a profile that trains fills the dataset even without download in the list.
        ({"workloads": ["train", "inference"], "train": True}, 62.1, "coco"),
        ({"workloads": ["train", "inference"], "train": False}, 21.1, "none"),
        # A remote controller keeps its build/wheelhouse on its own disk.
        ({"controller_is_host": False}, 59.1, "coco"),
        # k3s: a second copy in containerd, no minikube base; on a data server's NFS the dataset is not here.
        ({"cluster": "k3s"}, 59.6, "coco"),
        ({"cluster": "k3s", "dataset_elsewhere": True}, 18.6, "none"),
        # The Docker runtime keeps one copy, unless the images are also written as tarballs.
        ({"cluster": "docker"}, 53.3, "coco"),
        ({"cluster": "docker", "images_load": "tarball"}, 59.6, "coco"),
        # A cluster of the user's: the workloads and their data run elsewhere.
        ({"cluster": "none"}, 12.3, "none"),
    ],
)
def test_what_is_counted_follows_the_plan(change, needed, data):
    plan = {**GPU_VM, **change}
    assert disk.dataset(plan) == data
    assert check(plan, 0)["needed_gb"] == needed


def test_a_rerun_counts_what_earlier_runs_stored():
    """After a run on a disk that held its peak, what is left free plus what the run stored holds the estimate,
    although the dataset takes less than at its peak (COCO's archives are gone)."""
    disk_size = 64 * GB
    stored = int((12.6 + 6 + 2.5 + 21) * GB)  # images twice, wheelhouse twice, minikube, the extracted COCO
    host = {"disk_free_bytes": disk_size - stored, "disk_stored_bytes": stored, "disk_mount": "/"}
    result = disk.disk_check(host, GPU_VM, SIZES, data_root="/var/lib/docker")
    assert result["enough"]
    assert result["summary"] == (
        "Disk: 21.9 GB free on / (the filesystem of /var/lib/docker) and 42.1 GB already stored there by earlier "
        "runs (preflight_disk_stored_paths), 62.1 GB needed"
    )
    host["disk_free_bytes"] = 19 * GB
    result = disk.disk_check(host, GPU_VM, SIZES, data_root="/var/lib/docker")
    assert not result["enough"]
    assert result["message"].startswith(
        "19 GB free on / (the filesystem of /var/lib/docker) and 42.1 GB already stored there by earlier runs"
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
    assert "preflight_min_disk_free_gb asks for 100 GB (this host's run would store about 62.1 GB:" in result["message"]


@pytest.mark.parametrize(
    ("plan", "sizes", "error"),
    [
        ({**GPU_VM, "cluster": "kind"}, SIZES, "plan.cluster must be one of minikube, k3s, docker, none"),
        ({**GPU_VM, "images_mode": "offline"}, SIZES, "images_mode must be one of pull, airgap"),
        ({**GPU_VM, "workloads": "download"}, SIZES, "workloads must be a list"),
        ({"cluster": "minikube"}, SIZES, "preflight_disk_plan needs the keys"),
        (GPU_VM, {"coco": 45}, "preflight_disk_sizes_gb lacks images, wheelhouse, minikube_base, demo"),
    ],
)
def test_unusable_inputs_are_named(plan, sizes, error):
    with pytest.raises(AnsibleFilterError, match=error):
        disk.disk_check({"disk_free_bytes": 0, "disk_mount": "/"}, plan, sizes)
