"""Data that outlives the hosts: the dataset and the output on the data server's NFS exports (k8s/components/
nfs-storage), or on a ReadWriteMany class, for k3s across hosts; rendered through kustomize as the role does.

The schema tests (test_render_and_schema.py) validate these layers too: they are in SITE_VARIANTS.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from k8s.k8s_render import (
    K8S,
    MULTINODE_VARIANTS,
    NFS_SETTINGS,
    REPO,
    find,
    kustomize,
    load_workloads_filters,
    pod_spec,
    workloads,
)

filters = load_workloads_filters()
jobs = load_workloads_filters("jobs")
quantities = load_workloads_filters("quantities")
sizing = load_workloads_filters("sizing")
# claim -> the name its NFS volume starts with (the rest derives from the source: test_nfs_volumes.py).
CLAIMS = {"dinops-dataset": "dinops-dataset-nfs-", "dinops-output": "dinops-output-nfs-"}


def nfs_volume(objects: list[dict], claim: str) -> dict:
    """The rendered NFS volume of a claim, found by the label the claim selects and named by the claim's
    volumeName."""
    volumes = [
        o for o in objects
        if o["kind"] == "PersistentVolume" and o["metadata"]["labels"].get("app.kubernetes.io/name") == claim
    ]  # fmt: skip
    assert len(volumes) == 1, volumes
    assert volumes[0]["metadata"]["name"].startswith(CLAIMS[claim])
    assert find(objects, "PersistentVolumeClaim", claim)["spec"]["volumeName"] == volumes[0]["metadata"]["name"]
    return volumes[0]


NFS = sorted(name for name in MULTINODE_VARIANTS if name.endswith("-nfs"))
CLASS = sorted(name for name in MULTINODE_VARIANTS if name.endswith("-class"))


@pytest.mark.parametrize("name", NFS)
def test_nfs_volumes_are_shared_by_every_node(rendered_sites, name):
    objects = rendered_sites[name]
    for claim in CLAIMS:
        pvc = find(objects, "PersistentVolumeClaim", claim)["spec"]
        pv = nfs_volume(objects, claim)
        assert pvc["accessModes"] == ["ReadWriteMany"] and pv["spec"]["accessModes"] == ["ReadWriteMany"]
        # Bound by label to this volume only, with no class (a provisioner would create a node-local one).
        assert pvc["storageClassName"] == "" and pv["spec"]["storageClassName"] == ""
        assert pvc["selector"]["matchLabels"].items() <= pv["metadata"]["labels"].items()
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        assert pv["spec"]["nfs"]["server"] == NFS_SETTINGS["server"]
        assert pv["spec"]["nfs"]["path"] == NFS_SETTINGS["paths"][claim.removeprefix("dinops-")]
        assert pv["spec"]["mountOptions"] == NFS_SETTINGS["mount_options"]
        # The volume offers at least what the claim asks for, or the claim stays Pending.
        asked = quantities.quantity_mi(pvc["resources"]["requests"]["storage"])
        assert quantities.quantity_mi(pv["spec"]["capacity"]["storage"]) >= asked
    assert "nfs-server.invalid" not in json.dumps(objects)
    # The pods still go where their node role says.
    assert pod_spec(find(objects, "Job", "dinops-train"))["nodeSelector"] == {"dinops.io/train": "true"}
    assert pod_spec(find(objects, "Deployment", "dinops-serve"))["nodeSelector"] == {"dinops.io/inference": "true"}


@pytest.mark.parametrize("name", CLASS)
def test_a_read_write_many_class_works_instead(rendered_sites, name):
    objects = rendered_sites[name]
    assert not [o for o in objects if o["kind"] == "PersistentVolume"]
    for claim in CLAIMS:
        spec = find(objects, "PersistentVolumeClaim", claim)["spec"]
        assert spec["accessModes"] == ["ReadWriteMany"] and spec["storageClassName"] == "nfs-csi"


@pytest.mark.parametrize("name", sorted(MULTINODE_VARIANTS))
def test_pods_fit_the_node_they_are_pinned_to(rendered_sites, name):
    """What lands on one node (download and training on the train node, inference on the inference node) fits
    what that node can allocate (the smallest node of its role, k3s's own pods counted on each)."""
    settings = MULTINODE_VARIANTS[name]
    plan = sizing.site_plan(settings)
    objects = jobs.prepare_objects(rendered_sites[name], True, True)
    by_node: dict[str, list[dict]] = {}
    for obj in workloads(objects):
        selector = pod_spec(obj).get("nodeSelector") or {}
        by_node.setdefault(json.dumps(selector, sort_keys=True), []).append(obj)
    for selector, objs in by_node.items():
        app = objs[0]["metadata"]["name"].removeprefix("dinops-")
        node = plan["nodes"][app]
        total = {"cpu_m": 0, "memory_mi": 0}
        for obj in objs:
            for container in pod_spec(obj)["containers"]:
                requests = container.get("resources", {}).get("requests", {})
                total["cpu_m"] += quantities.cpu_m(requests.get("cpu", "0"))
                total["memory_mi"] += quantities.quantity_mi(requests.get("memory", "0"))
        assert total["cpu_m"] <= node["cpu_m"] and total["memory_mi"] <= node["memory_mi"], (name, selector, total)


def _render(tmp_path: Path, settings: dict) -> list[dict]:
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    kustomization = filters.site_kustomization(settings)
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return kustomize(tree / "site")


def test_one_k3s_host_with_a_data_server_keeps_its_data_there(tmp_path):
    # One host (no placement): the data server still carries the data, so that the next VM finds it.
    objects = _render(
        tmp_path,
        {"overlay": "k3s-gpu", "train": True, "shm_size": "2Gi", "nfs": {**NFS_SETTINGS, "mount_options": []}},
    )
    pv = nfs_volume(objects, "dinops-output")
    assert "mountOptions" not in pv["spec"] and pv["spec"]["nfs"]["server"] == "10.0.1.5"
    assert find(objects, "PersistentVolumeClaim", "dinops-output")["spec"]["accessModes"] == ["ReadWriteMany"]


BASE = {"overlay": "k3s-gpu", "train": True, "shm_size": "2Gi"}


@pytest.mark.parametrize(
    ("nfs", "extra", "message"),
    [
        ({"server": "nfs://10.0.1.5"}, {}, "workloads_nfs_server must be a host name"),
        ({"server": "10.0.1.5:2049"}, {}, "workloads_nfs_server must be a host name"),
        ({"server": "fd00::5::6"}, {}, "workloads_nfs_server must be a host name"),
        ({"paths": {"dataset": "srv/data", "output": "/srv/out"}}, {}, r"workloads_nfs_paths.dataset must be"),
        ({"paths": {"dataset": "/srv/x"}}, {}, "workloads_nfs_paths must give exactly dataset, output"),
        ({"paths": {"dataset": "/srv/x/", "output": "/srv/x"}}, {}, "their own exports"),
        ({"paths": {"dataset": "/srv/../etc", "output": "/srv/x"}}, {}, r"workloads_nfs_paths.dataset"),
        ({"mount_options": "nfsvers=4.2,hard"}, {}, "workloads_nfs_mount_options must be a list"),
        ({"mount_options": ["hard,intr"]}, {}, "workloads_nfs_mount_options must be a list of single"),
        ({}, {"static_volumes": True}, "workloads_nfs_server and workloads_static_volumes"),
        ({}, {"cluster": "docker", "overlay": "cpu"}, "nfs_client_mounts"),
    ],
)
def test_bad_nfs_settings_name_the_variable(nfs, extra, message):
    with pytest.raises(filters.WorkloadsError, match=message):
        filters.site_kustomization({**BASE, **extra, "nfs": {**NFS_SETTINGS, **nfs}})


def test_the_role_default_paths_are_the_data_server_exports():
    """workloads_nfs_paths (what the volumes mount) and nfs_server's exports (what the data stage serves) agree."""
    server = yaml.safe_load((REPO / "roles" / "nfs_server" / "defaults" / "main.yml").read_text())
    exported = [export["path"] for export in server["nfs_server_exports"]]
    for claim, path in NFS_SETTINGS["paths"].items():
        assert path in exported, f"workloads_nfs_paths.{claim} {path} is not in nfs_server_exports {exported}"
