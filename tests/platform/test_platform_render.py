"""Rendering a bundle: what the role changes in the upstream manifests, how it splits them for the apply (CRDs and
Namespaces first), what it records for a teardown, and what a teardown deletes."""

from __future__ import annotations

import json

import pytest
import yaml

ALL = ["cert_manager", "trainer", "katib", "training_operator", "kserve"]
MIRROR = "registry.local:5000/mirror"


def settings(releases, **overrides) -> dict:
    return {
        "releases": releases,
        "components": ALL,
        "trainer_runtimes": ["torch-distributed"],
        "storage_class": "",
        "katib_inject_security_context": True,
        "kserve_deployment_mode": "Standard",
        "kserve_disable_ingress_creation": True,
        "mirror": "",
        **overrides,
    }


def objects_of(rendered: dict, name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(rendered["files"][name]) if doc]


def find(rendered: dict, kind: str, name: str) -> dict:
    for text in rendered["files"].values():
        for doc in yaml.safe_load_all(text):
            if doc and doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} rendered")


@pytest.fixture
def rendered(render_plugin, releases, bundle_dir) -> dict:
    return render_plugin.render(str(bundle_dir), settings(releases, storage_class="local-path", mirror=MIRROR))


def test_each_component_is_split_into_crds_with_namespaces_then_the_rest(rendered):
    steps = rendered["steps"]
    assert [s["component"] for s in steps] == ALL
    trainer = steps[1]
    assert trainer == {
        "component": "trainer",
        "field_manager": "dinops-platform-trainer",
        "crds_file": "02-trainer-crds-namespaces.yaml",
        "objects_file": "02-trainer-objects.yaml",
        "crds": [
            "clustertrainingruntimes.trainer.kubeflow.org",
            "jobsets.jobset.x-k8s.io",
            "trainingruntimes.trainer.kubeflow.org",
            "trainjobs.trainer.kubeflow.org",
        ],
        "workloads": {
            "kubeflow-system": [
                "Deployment jobset-controller-manager",
                "Deployment kubeflow-trainer-controller-manager",
            ]
        },
    }
    first = {doc["kind"] for doc in objects_of(rendered, "02-trainer-crds-namespaces.yaml")}
    rest = {doc["kind"] for doc in objects_of(rendered, "02-trainer-objects.yaml")}
    assert first == {"CustomResourceDefinition", "Namespace"}
    assert not rest & first
    assert steps[3]["field_manager"] == "dinops-platform-training-operator"
    # cert-manager's Role in kube-system: applied, but kube-system is neither created nor waited for.
    assert list(steps[0]["workloads"]) == ["cert-manager"]
    assert "kube-system" not in [
        d["metadata"]["name"] for d in objects_of(rendered, "01-cert_manager-crds-namespaces.yaml")
    ]
    assert find(rendered, "Role", "cert-manager:leaderelection")["metadata"]["namespace"] == "kube-system"


def test_only_the_chosen_trainer_runtimes_are_applied(render_plugin, releases, bundle_dir, rendered):
    runtimes = [
        d["metadata"]["name"]
        for d in objects_of(rendered, "02-trainer-objects.yaml")
        if d["kind"] == "ClusterTrainingRuntime"
    ]
    assert runtimes == ["torch-distributed"]
    assert not any("deepspeed" in ref for ref in rendered["images"])
    with pytest.raises(render_plugin.RenderError, match="platform_trainer_runtimes names mpi-distributed"):
        render_plugin.render(str(bundle_dir), settings(releases, trainer_runtimes=["mpi-distributed"]))


def test_katibs_claim_gets_the_storage_class_and_only_when_one_is_set(render_plugin, releases, bundle_dir, rendered):
    assert find(rendered, "PersistentVolumeClaim", "katib-mysql")["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "10Gi"}},
        "storageClassName": "local-path",
    }
    default = render_plugin.render(str(bundle_dir), settings(releases))
    assert "storageClassName" not in find(default, "PersistentVolumeClaim", "katib-mysql")["spec"]


def test_katibs_collector_copies_the_trial_containers_security_context(rendered):
    config = yaml.safe_load(find(rendered, "ConfigMap", "katib-config")["data"]["katib-config.yaml"])
    assert config["init"]["controller"] == {"webhookPort": 8443, "injectSecurityContext": True}
    assert config["runtime"]["suggestions"][0]["image"] == f"{MIRROR}/kubeflow/katib/suggestion-hyperopt:v0.19.0"


def test_the_training_operator_names_its_init_image_and_mounts_a_restricted_template(rendered):
    pod = find(rendered, "Deployment", "training-operator")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"] == [f"--pytorch-init-container-image={MIRROR}/library/alpine:3.10"]
    assert container["volumeMounts"][-1] == {
        "name": "training-operator-pytorch-init-container",
        "mountPath": "/etc/config",
    }
    assert pod["volumes"][-1] == {
        "name": "training-operator-pytorch-init-container",
        "configMap": {"name": "training-operator-pytorch-init-container"},
    }
    template = find(rendered, "ConfigMap", "training-operator-pytorch-init-container")["data"]["initContainer.yaml"]
    # What the operator does with it (initcontainer.go): Go template values in, then YAML into []Container.
    filled = template.replace("{{.InitContainerImage}}", "alpine:3.10").replace("{{.MaxTries}}", "100")
    init = yaml.safe_load(filled.replace("{{.MasterAddr}}", "dinops-train-master-0"))[0]
    assert init["securityContext"]["runAsNonRoot"] is True
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "nslookup dinops-train-master-0" in init["command"][2]


def test_kserve_runs_in_standard_mode_without_ingress_in_its_own_namespace(rendered):
    config = find(rendered, "ConfigMap", "inferenceservice-config")["data"]
    assert json.loads(config["deploy"]) == {"defaultDeploymentMode": "Standard"}
    ingress = json.loads(config["ingress"])
    assert ingress["disableIngressCreation"] is True
    assert ingress["domainTemplate"] == "{{ .Name }}-{{ .Namespace }}.{{ .IngressDomain }}"
    # kserve.yaml ships no Namespace: the role adds it, first.
    assert objects_of(rendered, "05-kserve-crds-namespaces.yaml")[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "kserve"},
    }


def test_a_namespace_another_component_creates_is_not_added_again(render_plugin, releases, bundle_dir, helpers):
    rendered = render_plugin.render(str(bundle_dir), settings(releases))
    # katib and the training operator both bring kubeflow themselves; nobody brings it twice within a component.
    names = [
        (step["component"], d["metadata"]["name"])
        for step in rendered["steps"]
        for d in objects_of(rendered, step["crds_file"])
        if d["kind"] == "Namespace"
    ]
    assert names == [
        ("cert_manager", "cert-manager"),
        ("trainer", "kubeflow-system"),
        ("katib", "kubeflow"),
        ("training_operator", "kubeflow"),
        ("kserve", "kserve"),
    ]


def test_every_image_is_mirrored_and_listed_in_full(rendered):
    for text in rendered["files"].values():
        for doc in yaml.safe_load_all(text):
            for container in (doc or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                assert container["image"].startswith(MIRROR + "/")
    assert "docker.io/library/mysql:8.0.29" in rendered["image_list"]
    assert f"docker.io/library/mysql:8.0.29 {MIRROR}/library/mysql:8.0.29" in rendered["mirror"]
    assert rendered["unlisted"] == []
    assert "mysql:8.0.29" in rendered["images"]


def test_an_image_the_pinned_list_lacks_is_reported_with_its_component(render_plugin, releases, bundle_dir, helpers):
    manifests = helpers.upstream_manifests()
    mysql = manifests["katib"]["katib-standalone.yaml"][5]
    mysql["spec"]["template"]["spec"]["containers"][0]["image"] = "mysql:8.0.30"
    helpers.write_bundle(bundle_dir, releases, manifests)
    rendered = render_plugin.render(str(bundle_dir), settings(releases))
    assert rendered["unlisted"] == ["mysql:8.0.30 (katib)"]


def test_the_rendered_files_are_one_json_document_per_object(rendered):
    text = rendered["files"]["03-katib-objects.yaml"]
    assert text.startswith("---\n{")
    documents = text.split("---\n")[1:]
    assert [json.loads(doc)["kind"] for doc in documents][:2] == ["ConfigMap", "PersistentVolumeClaim"]


def test_the_inventory_names_every_object_with_its_component(rendered):
    inventory = rendered["inventory"]
    assert {
        "component": "katib",
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "name": "katib-mysql",
        "namespace": "kubeflow",
    } in inventory
    assert {
        "component": "trainer",
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "name": "trainjobs.trainer.kubeflow.org",
    } in inventory
    assert len(inventory) == sum(len(objects_of(rendered, name)) for name in rendered["files"])


def test_a_teardown_keeps_crds_data_and_namespaces_unless_told(render_plugin, rendered):
    plan = render_plugin.teardown_plan(rendered["inventory"])
    assert [group["name"] for group in plan] == ["webhooks", "operators"]
    webhooks = yaml.safe_load_all(plan[0]["text"])
    assert {d["kind"] for d in webhooks} == {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
    operators = [d for d in yaml.safe_load_all(plan[1]["text"])]
    kinds = {d["kind"] for d in operators}
    assert kinds.isdisjoint({"CustomResourceDefinition", "PersistentVolumeClaim", "Namespace"})
    assert {"Deployment", "ConfigMap", "ClusterTrainingRuntime", "Issuer"} <= kinds
    assert {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "katib-mysql", "namespace": "kubeflow"},
    } in operators

    with_data = render_plugin.teardown_plan(rendered["inventory"], True)
    assert [group["name"] for group in with_data] == ["webhooks", "operators", "data", "namespaces"]
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(with_data[2]["text"])] == ["katib-mysql"]
    namespaces = [d["metadata"]["name"] for d in yaml.safe_load_all(with_data[3]["text"])]
    assert namespaces == ["cert-manager", "kubeflow-system", "kubeflow", "kserve"]
    assert not any("CustomResourceDefinition" in group["text"] for group in with_data)
    # A cluster's own namespace is never deleted, whatever the record says.
    system = {"component": "x", "apiVersion": "v1", "kind": "Namespace", "name": "kube-system"}
    assert "kube-system" not in render_plugin.teardown_plan([*rendered["inventory"], system], True)[3]["text"]
    assert render_plugin.teardown_plan([]) == []
