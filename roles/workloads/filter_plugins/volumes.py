"""What happens to the data volumes before the apply, so that each claim binds the volume this layer renders.

``dinops_volume_plan`` compares the rendered PersistentVolumes (k8s/components/nfs-storage, static-pv) with the
cluster's and says which claims and volumes go first (tasks/volumes.yml does it):

- a claim bound to a volume of ours that this layer no longer renders (the data server was replaced and has a new
  address, the NFS path or mount options changed, hostPath volumes gave way to NFS): the workloads that use it stop,
  the claim and the old volume are deleted (``Retain``: the files stay where they are) and the apply creates the
  claim again, bound by name to the new volume. A volume's source is immutable after creation, so it cannot be
  edited in place (Kubernetes ValidatePersistentVolumeUpdate);
- a rendered volume that is ``Released`` (its claim was deleted: teardown with ``workloads_delete_data``, or a
  namespace deleted by hand) is made ``Available`` again by removing its ``claimRef``: a released volume is "not yet
  available for another claim" (https://kubernetes.io/docs/concepts/storage/persistent-volumes/#retain) and the new
  claim would stay Pending for ever;
- volumes of ours that nothing renders any more (leftovers of the same labels) are deleted, so that no claim binds
  an old address again.

A claim bound to a volume that is not ours (provisioned from a storage class) is never deleted: its data would go
with it; the run stops and says how to move it.
"""

from __future__ import annotations

from typing import Any

# The claims of the workloads; our volumes carry the claim's name as app.kubernetes.io/name and component=storage.
CLAIMS = ("dinops-dataset", "dinops-output")
COMPONENT = ("app.kubernetes.io/component", "storage")


class VolumePlanError(ValueError):
    """A claim the role cannot re-bind without losing data; the message says what to do."""


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _ours(volume: dict[str, Any]) -> str | None:
    """The claim a volume of ours is for, or None for any other volume."""
    labels = _labels(volume)
    if labels.get(COMPONENT[0]) == COMPONENT[1] and labels.get("app.kubernetes.io/name") in CLAIMS:
        return labels["app.kubernetes.io/name"]
    return None


def volume_plan(
    objects: list[dict[str, Any]], volumes: list[dict[str, Any]], claims: list[dict[str, Any]], namespace: str
) -> dict[str, Any]:
    """``objects``: the rendered objects; ``volumes``: the cluster's PersistentVolumes labelled
    component=storage; ``claims``: the PersistentVolumeClaims of ``namespace``. Returns {stop, delete_claims,
    delete_volumes, release_volumes, reasons}: stop is true when claims must be deleted (their pods first)."""
    rendered = {o["metadata"]["name"]: _ours(o) for o in objects if o.get("kind") == "PersistentVolume"}
    rendered = {name: claim for name, claim in rendered.items() if claim}
    claims_with_volumes = set(rendered.values())
    live = {v["metadata"]["name"]: v for v in volumes}
    plan: dict[str, Any] = {"delete_claims": [], "delete_volumes": [], "release_volumes": [], "reasons": []}
    for claim in claims:
        name = claim["metadata"]["name"]
        bound = (claim.get("spec") or {}).get("volumeName") or ""
        if name not in claims_with_volumes or not bound or bound in rendered:
            continue
        if bound not in live or not _ours(live[bound]):
            raise VolumePlanError(
                f"claim {namespace}/{name} is bound to volume {bound}, which is not one of the data volumes this "
                f"deployment renders (a storage class provisioned it?); deleting the claim could delete its data. "
                f"Copy what you need from it, then `kubectl -n {namespace} delete pvc {name}` (and the volume, if "
                "kept) and run again"
            )
        plan["delete_claims"].append(name)
        plan["reasons"].append(f"claim {name}: bound to {bound}, now {_rendered_for(rendered, name)}")
    for volume_name, volume in sorted(live.items()):
        claim = _ours(volume)
        ref = (volume.get("spec") or {}).get("claimRef") or {}
        in_namespace = not ref or ref.get("namespace") == namespace
        if not claim or claim not in claims_with_volumes or not in_namespace:
            continue
        if volume_name not in rendered:
            plan["delete_volumes"].append(volume_name)
            plan["reasons"].append(f"volume {volume_name}: replaced by {_rendered_for(rendered, claim)} (files kept)")
        elif (volume.get("status") or {}).get("phase") == "Released":
            plan["release_volumes"].append(volume_name)
            plan["reasons"].append(f"volume {volume_name}: released by a deleted claim, made available again")
    plan["stop"] = bool(plan["delete_claims"])
    return plan


def volumes_of_namespace(volumes: list[dict[str, Any]], namespace: str) -> list[str]:
    """The data volumes of ours whose claim is (or was) in ``namespace``: what a teardown with
    workloads_delete_data deletes once the claims are gone. Another namespace's volumes are never touched."""
    return sorted(
        v["metadata"]["name"]
        for v in volumes
        if _ours(v) and ((v.get("spec") or {}).get("claimRef") or {}).get("namespace") == namespace
    )


def _rendered_for(rendered: dict[str, str], claim: str) -> str:
    return next(name for name, of in rendered.items() if of == claim)


class FilterModule:
    """workloads: the data volumes before the apply."""

    def filters(self) -> dict[str, Any]:
        return {"dinops_volume_plan": volume_plan, "dinops_volumes_of_namespace": volumes_of_namespace}
