"""The data volumes follow the data server and survive a teardown (audit round 2, findings 12 and 13).

A PersistentVolume's source is immutable ("spec.persistentvolumesource is immutable after creation"): a replaced
data server with a new address must make new volumes, and the claims must move to them (rendered here through
`kubectl kustomize` as the role does; the re-binding decisions of filter_plugins/volumes.py on the rendered
objects). After a teardown with workloads_delete_data the Retain volumes would be Released for ever: the teardown
deletes them, and the next apply makes any Released one of ours Available again.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from k8s.k8s_render import NFS_SETTINGS, REPO, find, load_workloads_filters, render_site

volumes = load_workloads_filters("volumes")
BASE = {"overlay": "k3s-gpu", "train": True, "shm_size": "2Gi"}
CLAIMS = ("dinops-dataset", "dinops-output")
NAMESPACE = "dinops"


def render(tmp_path: Path, name: str, **nfs) -> list[dict]:
    return render_site(tmp_path, name, {**BASE, "nfs": {**NFS_SETTINGS, **nfs}})


def nfs_volumes(objects: list[dict]) -> dict[str, dict]:
    """claim -> its rendered PersistentVolume."""
    return {o["metadata"]["labels"]["app.kubernetes.io/name"]: o for o in objects if o["kind"] == "PersistentVolume"}


def volume_name(objects: list[dict], claim: str) -> str:
    return nfs_volumes(objects)[claim]["metadata"]["name"]


def test_a_new_server_address_makes_new_volumes_that_the_claims_bind_by_name(tmp_path):
    before = render(tmp_path, "before")
    again = render(tmp_path, "again")
    replaced = render(tmp_path, "replaced", server="10.0.1.77")
    moved = render(tmp_path, "moved", paths={**NFS_SETTINGS["paths"], "output": "/srv/dinops/outputs-2"})
    for claim in CLAIMS:
        old, new = nfs_volumes(before)[claim], nfs_volumes(replaced)[claim]
        assert new["spec"]["nfs"]["server"] == "10.0.1.77"
        # Same settings, same name (a re-run changes nothing); a new source is a new volume, never an edit.
        assert volume_name(again, claim) == old["metadata"]["name"]
        assert new["metadata"]["name"] != old["metadata"]["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", new["metadata"]["name"])
        for objects in (before, replaced, moved):
            pv = nfs_volumes(objects)[claim]
            assert find(objects, "PersistentVolumeClaim", claim)["spec"]["volumeName"] == pv["metadata"]["name"]
    # A new path is a new volume of that claim only.
    assert volume_name(moved, "dinops-output") != volume_name(before, "dinops-output")
    assert volume_name(moved, "dinops-dataset") == volume_name(before, "dinops-dataset")


# --- The cluster's side: what the role finds before the apply ------------------------------------------------------


def live_volume(pv: dict, phase: str, claim: str | None = None, namespace: str = NAMESPACE) -> dict:
    """A rendered volume as the API server returns it: with a claimRef and a phase."""
    live = yaml.safe_load(yaml.safe_dump(pv))
    if claim:
        live["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim,
                                    "uid": "0b1f-old"}  # fmt: skip
    live["status"] = {"phase": phase}
    return live


def live_claim(name: str, volume: str) -> dict:
    return {"kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"volumeName": volume}, "status": {"phase": "Bound"}}  # fmt: skip


def test_the_claims_move_to_the_new_server_and_the_old_volumes_go(tmp_path):
    old = nfs_volumes(render(tmp_path, "old"))
    objects = render(tmp_path, "new", server="10.0.1.77")
    live = [live_volume(pv, "Bound", claim) for claim, pv in old.items()]
    claims = [live_claim(claim, pv["metadata"]["name"]) for claim, pv in old.items()]
    plan = volumes.volume_plan(objects, live, claims, NAMESPACE)
    assert plan["stop"] is True
    assert sorted(plan["delete_claims"]) == list(CLAIMS)
    assert sorted(plan["delete_volumes"]) == sorted(pv["metadata"]["name"] for pv in old.values())
    assert plan["release_volumes"] == []
    assert any("now " + nfs_volumes(objects)["dinops-dataset"]["metadata"]["name"] in r for r in plan["reasons"])


def test_nothing_changes_when_the_claims_are_bound_to_the_rendered_volumes(tmp_path):
    objects = render(tmp_path, "steady")
    live = [live_volume(pv, "Bound", claim) for claim, pv in nfs_volumes(objects).items()]
    claims = [live_claim(claim, pv["metadata"]["name"]) for claim, pv in nfs_volumes(objects).items()]
    plan = volumes.volume_plan(objects, live, claims, NAMESPACE)
    assert plan == {"delete_claims": [], "delete_volumes": [], "release_volumes": [], "reasons": [], "stop": False}


@pytest.mark.parametrize("storage", ["nfs", "static"])
def test_volumes_released_by_deleted_claims_are_made_available_again(tmp_path, storage):
    """Finding 13: after a teardown with workloads_delete_data (or a namespace deleted by hand) the volumes are
    Released with a claimRef to the deleted claims; new claims would stay Pending."""
    settings = {**BASE, "nfs": NFS_SETTINGS} if storage == "nfs" else {**BASE, "static_volumes": True}
    objects = render_site(tmp_path, storage, settings)
    rendered = nfs_volumes(objects)
    assert sorted(rendered) == list(CLAIMS)
    live = [live_volume(pv, "Released", claim) for claim, pv in rendered.items()]
    plan = volumes.volume_plan(objects, live, [], NAMESPACE)
    assert sorted(plan["release_volumes"]) == sorted(pv["metadata"]["name"] for pv in rendered.values())
    assert plan["stop"] is False and plan["delete_claims"] == [] and plan["delete_volumes"] == []


def test_leftover_volumes_of_an_old_address_are_deleted_and_others_left_alone(tmp_path):
    old = nfs_volumes(render(tmp_path, "old"))
    objects = render(tmp_path, "new", server="10.0.1.77")
    leftover = live_volume(old["dinops-output"], "Available")
    elsewhere = live_volume(old["dinops-dataset"], "Bound", "dinops-dataset", namespace="other-team")
    foreign = {"kind": "PersistentVolume", "metadata": {"name": "pvc-1234", "labels": {}}, "spec": {},
               "status": {"phase": "Released"}}  # fmt: skip
    plan = volumes.volume_plan(objects, [leftover, elsewhere, foreign], [], NAMESPACE)
    assert plan["delete_volumes"] == [old["dinops-output"]["metadata"]["name"]]
    assert plan["release_volumes"] == [] and plan["stop"] is False


def test_a_claim_on_a_provisioned_volume_is_never_deleted(tmp_path):
    objects = render(tmp_path, "nfs")
    claims = [live_claim("dinops-dataset", "pvc-5f0c")]
    provisioned = {"kind": "PersistentVolume", "metadata": {"name": "pvc-5f0c", "labels": {}},
                   "spec": {"storageClassName": "local-path"}, "status": {"phase": "Bound"}}  # fmt: skip
    with pytest.raises(volumes.VolumePlanError, match=r"claim dinops/dinops-dataset is bound to volume pvc-5f0c.*"
                       r"Copy what you need.*kubectl -n dinops delete pvc dinops-dataset"):  # fmt: skip
        volumes.volume_plan(objects, [provisioned], claims, NAMESPACE)


# --- The teardown -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("storage", ["nfs", "static"])
def test_teardown_with_data_removal_deletes_the_volumes_of_its_claims_only(tmp_path, storage):
    """Finding 13: teardown.yml deletes, with workloads_delete_data, the volumes the filter picks: those whose
    (deleted) claims were in this namespace; another deployment's volumes and foreign volumes stay."""
    settings = {**BASE, "nfs": NFS_SETTINGS} if storage == "nfs" else {**BASE, "static_volumes": True}
    rendered = nfs_volumes(render_site(tmp_path, storage, settings))
    ours = [live_volume(pv, "Released", claim) for claim, pv in rendered.items()]
    theirs = live_volume(rendered["dinops-output"], "Bound", "dinops-output", namespace="other-team")
    theirs["metadata"]["name"] += "-other"
    foreign = {"kind": "PersistentVolume", "metadata": {"name": "pvc-1", "labels": {}},
               "spec": {"claimRef": {"namespace": NAMESPACE, "name": "x"}}}  # fmt: skip
    chosen = volumes.volumes_of_namespace([*ours, theirs, foreign], NAMESPACE)
    assert chosen == sorted(pv["metadata"]["name"] for pv in rendered.values())

    tasks = yaml.safe_load((REPO / "roles" / "workloads" / "tasks" / "teardown.yml").read_text())
    deleting = [
        task
        for task in tasks
        if (task.get("kubernetes.core.k8s") or {}).get("kind") == "PersistentVolume"
        and task["kubernetes.core.k8s"].get("state") == "absent"
    ]
    assert deleting, "teardown.yml deletes no PersistentVolume"
    assert all("workloads_delete_data" in str(task.get("when")) for task in deleting)
    assert any("dinops_volumes_of_namespace(workloads_namespace)" in str(task.get("loop")) for task in deleting)
