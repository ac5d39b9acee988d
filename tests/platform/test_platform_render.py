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


def _template_annotations(rendered: dict, name: str) -> dict:
    return find(rendered, "Deployment", name)["spec"]["template"]["metadata"].get("annotations") or {}


def test_katib_restarts_when_a_trial_kind_operator_is_added(render_plugin, releases, bundle_dir):
    """A trial kind whose CRD appears after katib-controller started is never watched (trial_controller.go at
    v0.19.0): its pod template names the trial-kind operators installed with it, so adding one rolls it."""
    katib_only = render_plugin.render(str(bundle_dir), settings(releases, components=["trainer", "katib"]))
    both = render_plugin.render(
        str(bundle_dir), settings(releases, components=["trainer", "training_operator", "katib"])
    )
    assert _template_annotations(katib_only, "katib-controller")["dinops.io/trial-kind-operators"] == "trainer"
    assert (
        _template_annotations(both, "katib-controller")["dinops.io/trial-kind-operators"] == "trainer,training_operator"
    )


@pytest.mark.parametrize(
    ("deployment", "change"),
    [
        ("katib-controller", {"katib_inject_security_context": False}),
        ("training-operator", {"mirror": MIRROR}),
    ],
)
def test_a_controller_restarts_when_the_configuration_it_reads_once_changes(
    render_plugin, releases, bundle_dir, deployment, change
):
    """katib-controller reads katib-config's init section once at start (kubeflow/katib@v0.19.0:
    cmd/katib-controller/v1beta1/main.go GetInitConfigData); the Training Operator its init-container template
    once (kubeflow/trainer@v1.9.4:pkg/controller.v1/pytorch/initcontainer.go sync.Once). A hash of what they read
    in the pod template rolls them when it changes."""
    before = render_plugin.render(str(bundle_dir), settings(releases))
    after = render_plugin.render(str(bundle_dir), settings(releases, **change))
    again = render_plugin.render(str(bundle_dir), settings(releases))
    key = "dinops.io/config-sha256"
    assert _template_annotations(before, deployment)[key] != _template_annotations(after, deployment)[key]
    assert _template_annotations(before, deployment)[key] == _template_annotations(again, deployment)[key]


def test_the_operators_requests_are_within_the_pinned_node_budget(rendered):
    assert rendered["budget"] == []


def test_an_operator_requesting_more_than_the_budget_is_refused(render_plugin, releases, bundle_dir, helpers):
    """The workloads stage reserves platform_releases.<component>.pods on the node: a release whose pods request
    more (or a pod the table lacks that requests anything) would leave dinops pods Pending."""
    manifests = helpers.upstream_manifests()

    def workload(component: str, file: str, name: str) -> dict:
        return next(d for d in manifests[component][file] if (d["kind"], d["metadata"]["name"]) == ("Deployment", name))

    workload("trainer", "manager.yaml", "jobset-controller-manager")["spec"]["replicas"] = 2
    mysql = workload("katib", "katib-standalone.yaml", "katib-mysql")
    mysql["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "250m"}}
    helpers.write_bundle(bundle_dir, releases, manifests)
    budget = render_plugin.render(str(bundle_dir), settings(releases))["budget"]
    assert budget == [
        "trainer: Deployment jobset-controller-manager requests 1000m CPU and 256Mi memory, "
        "roles/platform/vars/main.yml pins 500m and 128Mi (platform_releases.trainer.pods)",
        "katib: Deployment katib-mysql requests 250m CPU and 0Mi memory, roles/platform/vars/main.yml pins 0m and "
        "0Mi (platform_releases.katib.pods)",
    ]


def test_katibs_own_namespace_is_not_under_its_pod_webhook(rendered):
    """mutator.pod.katib.kubeflow.org (failurePolicy Fail by default) exempts only katib-controller's own requests
    (kubeflow/katib@v0.19.0:manifests/v1beta1/components/webhook/webhooks.yaml matchConditions), not the ReplicaSet
    controller re-creating katib-controller's pod: its namespace must not be selected."""
    kubeflow = find(rendered, "Namespace", "kubeflow")
    assert "katib.kubeflow.org/metrics-collector-injection" not in (kubeflow["metadata"].get("labels") or {})


def test_the_trial_namespace_is_labelled_only_for_a_search(render_plugin):
    """Every pod created in a labelled namespace goes through Katib's pod webhook: without a search the role's
    field manager applies the Namespace without the label, which removes the one it set before."""
    assert render_plugin.trial_namespace("dinops", True) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "dinops", "labels": {"katib.kubeflow.org/metrics-collector-injection": "enabled"}},
    }
    assert render_plugin.trial_namespace("dinops", False) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "dinops"},
    }


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
