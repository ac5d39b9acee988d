"""Every overlay renders with `kubectl kustomize`, and every object is valid for Kubernetes 1.28 to 1.33.

Strict validation: a field the schema does not know is an error, as with `kubectl apply --validate=strict`.
"""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml
from k8s.k8s_render import K8S, OVERLAYS, SITE_VARIANTS

KUBERNETES_VERSIONS = ("1.28", "1.29", "1.30", "1.31", "1.32", "1.33")
EXPECTED_KINDS = {
    "Namespace": 1,
    "ConfigMap": 4,
    "PersistentVolumeClaim": 2,
    "Job": 2,
    "Deployment": 2,
    "Service": 2,
    # Who may reach the API and what the API and the client may reach (k8s/base/networkpolicy-*.yaml).
    "NetworkPolicy": 2,
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_every_object_once(rendered, overlay):
    kinds: dict[str, int] = {}
    for obj in rendered[overlay]:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    assert kinds == EXPECTED_KINDS


def test_base_holds_one_object_per_file_and_lists_every_file():
    base = K8S / "base"
    listed = yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    on_disk = sorted(p.name for p in base.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    for name in on_disk:
        documents = [d for d in yaml.safe_load_all((base / name).read_text()) if d]
        assert len(documents) == 1, f"{name} holds {len(documents)} objects"


def _validate_all(objects, version):
    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.absolute_path)}")
    return errors


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_objects_validate_strictly(rendered, overlay, version):
    assert _validate_all(rendered[overlay], version) == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("site", sorted(SITE_VARIANTS))
def test_generated_site_objects_validate_strictly(rendered_sites, site, version):
    assert _validate_all(rendered_sites[site], version) == []


def test_strict_validation_rejects_an_unknown_field(rendered):
    """The check above can fail: a misspelt field in a container is reported."""
    job = copy.deepcopy(next(o for o in rendered["cpu"] if o["kind"] == "Job"))
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    errors = _validate_all([job], "1.33")
    assert len(errors) == 1 and "resource" in errors[0]


# kubernetes-validate 1.37.0 knows which kinds are namespaced; these are the cluster-scoped ones we render.
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole", "ClusterRoleBinding"}


@pytest.mark.parametrize("site", sorted(SITE_VARIANTS))
def test_every_namespaced_object_of_a_layer_is_in_the_namespace(rendered_sites, site):
    """What a layer's components add (the checkpoint Job and its ConfigMaps, the Ingress, ...) lands in dinops too:
    an object without a namespace would be applied to the kubeconfig's default namespace."""
    stray = [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in rendered_sites[site]
        if o["kind"] not in CLUSTER_SCOPED and o["metadata"].get("namespace") != "dinops"
    ]
    assert stray == []
