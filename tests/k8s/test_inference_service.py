"""DINO behind a KServe InferenceService: k8s/components/inferenceservice rendered on each shipped profile's layer
(kubernetes runtimes), then folded by roles/workloads/filter_plugins/inference_service.py.

The drift test compares the folded predictor with the Deployment dinops-serve of the same render, field by field:
whatever a layer adds to the serve pod (GPU, CPU sizing, S3 credentials, checkpoint, placement) reaches the
InferenceService. KServe facts the tests hold to are cited in the component and the filter (kserve@v0.20.0).
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml
from k8s.crd_schema import CRDS, requires_crds, validate
from k8s.k8s_render import (
    GPU,
    GPU_OVERLAYS,
    K8S,
    SITE_VARIANTS,
    container_env,
    find,
    kustomize,
    load_workloads_filters,
    pod_spec,
    render_site,
)

from dinops.serve.settings import SETTINGS as SERVE_SETTINGS
from dinops.settings import env_names
from dinops_testing import load_plugin

plugin = load_plugin("roles/workloads/filter_plugins/inference_service.py")
workloads_filters = load_workloads_filters()
sizing = load_workloads_filters("sizing")
COMPONENT = K8S / "components" / "inferenceservice"
PORT = 8080
PROBE_FIELDS = ("startupProbe", "readinessProbe", "livenessProbe")
# Prometheus' objects (k8s/components/monitoring) and the DCGM exporter's Service, beside inference in either form.
MONITORING = {
    "dinops-prometheus",
    "dinops-train-metrics",
    "dinops-serve-metrics",
    "dinops-predictor-metrics",
    "dcgm-exporter",
}
# What the component sets on the model server: the port setting and the model's name (KServe's: the
# InferenceService's name).
COMPONENT_ENV = {"DINO_BIND": f"0.0.0.0:{PORT}", "DINO_MODEL_NAME": "dinops"}


def runs_on_kubernetes(settings: dict) -> bool:
    """The Docker runtime refuses workloads_inference_service (platform contract): its variants are left out."""
    return settings["overlay"] != "docker-gpu" and settings.get("cluster") != "docker"


def serves(settings: dict) -> bool:
    return sizing.site_plan(settings)["apps"]["serve"]


KSERVE_SITES = sorted(n for n, s in SITE_VARIANTS.items() if runs_on_kubernetes(s) and serves(s))
NO_INFERENCE_SITES = sorted(n for n, s in SITE_VARIANTS.items() if runs_on_kubernetes(s) and not serves(s))


def render_with_component(tmp_root, name: str, settings: dict) -> list[dict]:
    """The host's layer as the role renders it when workloads_inference_service is true (site_kustomization adds
    the component)."""
    tree = tmp_root / name / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    kustomization = workloads_filters.site_kustomization({**settings, "inference_service": True})
    assert "../components/inferenceservice" in kustomization["components"]
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return kustomize(tree / "site")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("kserve")
    return {name: render_with_component(root, name, SITE_VARIANTS[name]) for name in KSERVE_SITES}


@pytest.fixture(scope="module")
def folded(rendered) -> dict[str, list[dict]]:
    return {name: plugin.inference_service(objects, True) for name, objects in rendered.items()}


def predictor(objects: list[dict]) -> dict:
    return find(objects, "InferenceService", "dinops")["spec"]["predictor"]


def env_list(container: dict) -> dict[str, str]:
    """Explicit env only; a value from a Secret (valueFrom) reads "", as in k8s_render.container_env."""
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


# --- The drift test: the predictor is the Deployment's pod --------------------------------------------------------
@pytest.mark.parametrize("site", KSERVE_SITES)
def test_the_predictor_carries_the_serve_pod_it_replaces(rendered, folded, site):
    deployment = find(rendered[site], "Deployment", "dinops-serve")
    pod = pod_spec(deployment)
    serve = pod["containers"][0]
    folded_predictor = predictor(folded[site])
    container = folded_predictor["containers"][0]
    # Every container field but name, ports, probes and the port setting is the Deployment's.
    for field, value in serve.items():
        if field not in ("name", "ports", "env", *PROBE_FIELDS):
            assert container.get(field) == value, field
    assert set(container) - set(serve) <= {"env", *PROBE_FIELDS}
    assert env_list(container) == {**env_list(serve), **COMPONENT_ENV}
    # Every pod field: volumes, securityContext, tolerations, runtimeClassName, nodeSelector, ...
    for field, value in pod.items():
        if field != "containers":
            assert folded_predictor[field] == value, field
    assert folded_predictor["minReplicas"] == folded_predictor["maxReplicas"] == deployment["spec"].get("replicas", 1)
    assert folded_predictor["deploymentStrategy"] == deployment["spec"]["strategy"] == {"type": "Recreate"}
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    # The component's labels win: Istio's, and the serving form Prometheus' Services select by.
    assert template_labels["dinops.io/serving"] == "deployment"
    assert folded_predictor["labels"] == {**template_labels, "sidecar.istio.io/inject": "false",
                                          "dinops.io/serving": "kserve"}  # fmt: skip
    assert find(folded[site], "InferenceService", "dinops")["metadata"]["namespace"] == "dinops"


@pytest.mark.parametrize("site", KSERVE_SITES)
def test_the_model_server_sees_the_settings_of_the_deployment_but_its_port(rendered, folded, site):
    """The environment the container gets (ConfigMaps through envFrom plus env) is the Deployment's, the port
    setting moved to the declared port: explicit env wins over envFrom in Kubernetes."""
    serve = pod_spec(find(rendered[site], "Deployment", "dinops-serve"))["containers"][0]
    container = predictor(folded[site])["containers"][0]
    seen = {**container_env(folded[site], {"envFrom": container.get("envFrom", [])}), **env_list(container)}
    assert seen == {**container_env(rendered[site], serve), **COMPONENT_ENV}
    assert container_env(rendered[site], serve)["DINO_BIND"] == "0.0.0.0:8000"


@pytest.mark.parametrize("site", KSERVE_SITES)
def test_the_model_server_knows_every_setting_it_gets(folded, site):
    """dinops serve stops at start on an unknown DINO_* variable (dinops.settings.check_unknown_env)."""
    container = predictor(folded[site])["containers"][0]
    names = container_env(folded[site], container)
    assert {n for n in names if n.startswith("DINO_")} <= env_names(SERVE_SETTINGS)


@pytest.mark.parametrize("site", KSERVE_SITES)
def test_the_gpu_follows_the_profile(folded, site):
    settings = SITE_VARIANTS[site]
    on_gpu = settings["overlay"] in GPU_OVERLAYS and sizing.site_plan(settings)["serve_device"] == "gpu"
    folded_predictor = predictor(folded[site])
    container = folded_predictor["containers"][0]
    device = container_env(folded[site], container)["DINO_DEVICE"]
    if on_gpu:
        assert container["resources"]["limits"][GPU] == 1
        assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in folded_predictor["tolerations"]
        assert device == "cuda"
    else:  # the CPU overlay, or k8s/components/serve-on-cpu (the GPU goes to training)
        assert GPU not in container["resources"].get("limits", {})
        assert GPU not in container["resources"].get("requests", {})
        assert device == "cpu"


def test_both_devices_are_covered():
    devices = {
        (SITE_VARIANTS[s]["overlay"] in GPU_OVERLAYS, sizing.site_plan(SITE_VARIANTS[s])["serve_device"])
        for s in KSERVE_SITES
    }
    assert {(True, "gpu"), (True, "cpu"), (False, "cpu")} <= devices


# --- What KServe needs that the Deployment did not say --------------------------------------------------------
@pytest.mark.parametrize("site", KSERVE_SITES)
def test_port_8080_declared_once_with_the_port_setting_and_the_health_routes(folded, site):
    container = predictor(folded[site])["containers"][0]
    assert container["ports"] == [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]
    assert env_list(container)["DINO_BIND"] == f"0.0.0.0:{PORT}"
    assert (
        env_list(container)["DINO_MODEL_NAME"] == find(folded[site], "InferenceService", "dinops")["metadata"]["name"]
    )
    routes = {probe: (container[probe]["httpGet"]["path"], container[probe]["httpGet"]["port"]) for probe in
              PROBE_FIELDS}  # fmt: skip
    assert routes == {
        "startupProbe": ("/v2/health/live", "http"),
        "readinessProbe": ("/v2/health/ready", "http"),
        "livenessProbe": ("/v2/health/live", "http"),
    }


@pytest.mark.parametrize("site", KSERVE_SITES)
def test_standard_mode_without_autoscaler_ingress_or_sidecar(folded, site):
    metadata = find(folded[site], "InferenceService", "dinops")["metadata"]
    assert metadata["annotations"] == {
        "serving.kserve.io/deploymentMode": "Standard",
        "serving.kserve.io/autoscalerClass": "none",
        "sidecar.istio.io/inject": "false",
    }
    assert metadata["labels"]["networking.kserve.io/visibility"] == "cluster-local"
    assert metadata["labels"]["app.kubernetes.io/part-of"] == "dinops"


@requires_crds
@pytest.mark.parametrize("site", KSERVE_SITES)
def test_the_inference_service_validates_against_the_kserve_schema(folded, site):
    assert validate(find(folded[site], "InferenceService", "dinops")) == []


@requires_crds
def test_the_filter_knows_exactly_the_pod_fields_of_the_predictor_schema():
    crd = yaml.safe_load((CRDS / "kserve-v0.20.0-inferenceservices.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    fields = set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["predictor"]["properties"])
    assert fields >= plugin.POD_FIELDS
    # The PodSpec fields Kubernetes has that the predictor lacks: only ephemeralContainers (not in a template).
    pod_spec_fields = plugin.POD_FIELDS | {"containers", "ephemeralContainers"}
    assert pod_spec_fields - fields == {"ephemeralContainers"}
    assert {"minReplicas", "maxReplicas", "deploymentStrategy", "labels", "annotations"} <= fields


# --- What goes and what is repointed -----------------------------------------------------------------------------
@pytest.mark.parametrize("site", KSERVE_SITES)
def test_the_serve_deployment_and_service_go_and_the_client_calls_the_predictor(folded, site):
    objects = folded[site]
    assert [o for o in objects if o["metadata"]["name"] == "dinops-serve"] == []
    client = sizing.site_plan(SITE_VARIANTS[site])["apps"]["client"]
    left = sorted(
        (o["kind"], o["metadata"]["name"])
        for o in objects
        if o["kind"] in ("Deployment", "Service") and o["metadata"]["name"] not in MONITORING
    )
    assert left == ([("Deployment", "dinops-client"), ("Service", "dinops-client")] if client else [])
    # Prometheus' headless Services: the Deployment's (8000) leaves the predictor out, the component's (8080) takes
    # it in (tests/k8s/test_monitoring.py evaluates them against the predictor's pod labels).
    serve_metrics = find(objects, "Service", "dinops-serve-metrics")["spec"]["selector"]
    assert serve_metrics == {"app.kubernetes.io/name": "dinops-serve", "dinops.io/serving": "deployment"}
    predictor_metrics = find(objects, "Service", "dinops-predictor-metrics")["spec"]["selector"]
    assert predictor_metrics == {"app.kubernetes.io/name": "dinops-serve", "dinops.io/serving": "kserve"}
    (client_config,) = [o for o in objects if o["metadata"]["name"].startswith("dinops-client-config")]
    assert client_config["data"]["DINO_API_URL"] == "http://dinops-predictor"
    assert "http://dinops-serve" not in json.dumps(objects)


def test_the_ingress_sends_the_api_to_the_predictor_service(folded):
    (site,) = [s for s in KSERVE_SITES if SITE_VARIANTS[s].get("ingress")]
    backends = {
        path["path"]: path["backend"]["service"]
        for rule in find(folded[site], "Ingress", "dinops")["spec"]["rules"]
        for path in rule["http"]["paths"]
    }
    assert backends == {
        "/v1": {"name": "dinops-predictor", "port": {"number": 80}},
        "/": {"name": "dinops-client", "port": {"name": "http"}},
    }


def test_the_component_changes_nothing_else(tmp_path, rendered):
    """Without the fold the layer is the one without the component, plus the InferenceService and Prometheus'
    headless Service for it, the client's ConfigMap under its new content hash (so that the client's pods roll) and
    the client's reference to it."""
    site = "rtx3060ti-inference"
    before = render_site(tmp_path, site, SITE_VARIANTS[site])
    after = rendered[site]

    def key(obj):
        name = obj["metadata"]["name"]
        return obj["kind"], name.rsplit("-", 1)[0] if obj["kind"] == "ConfigMap" else name

    before_by_key = {key(o): o for o in before}
    after_by_key = {key(o): o for o in after}
    assert set(after_by_key) - set(before_by_key) == {("InferenceService", "dinops"),
                                                      ("Service", "dinops-predictor-metrics")}  # fmt: skip
    changed = sorted(k for k in before_by_key if before_by_key[k] != after_by_key[k])
    assert changed == [("ConfigMap", "dinops-client-config"), ("Deployment", "dinops-client")]
    client_env = pod_spec(after_by_key[("Deployment", "dinops-client")])["containers"][0]["envFrom"]
    assert client_env == [
        {"configMapRef": {"name": after_by_key[("ConfigMap", "dinops-client-config")]["metadata"]["name"]}}
    ]


def test_the_fold_leaves_its_input_alone(rendered):
    site = KSERVE_SITES[0]
    objects = rendered[site]
    snapshot = copy.deepcopy(objects)
    plugin.inference_service(objects, True)
    assert objects == snapshot


# --- Refusals ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("site", NO_INFERENCE_SITES)
def test_a_profile_without_inference_is_refused_naming_the_setting(tmp_path, site):
    # the layer refuses first (site_kustomization); the fold refuses too, for a layer written by hand
    with pytest.raises(Exception, match="workloads_inference_service is true, but .* runs no inference"):
        workloads_filters.site_kustomization({**SITE_VARIANTS[site], "inference_service": True})
    tree = tmp_path / site / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    kustomization = workloads_filters.site_kustomization(SITE_VARIANTS[site])
    kustomization["components"] = [*kustomization.get("components", []), "../components/inferenceservice"]
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    objects = kustomize(tree / "site")
    with pytest.raises(plugin.InferenceServiceError, match="workloads_inference_service.*no Deployment dinops-serve"):
        plugin.inference_service(objects, True)


@pytest.fixture
def objects(rendered) -> list[dict]:
    """One render to break, on a GPU host that serves (t4 on k3s)."""
    return copy.deepcopy(rendered["profile-t4-k3s-serve"])


def test_off_leaves_the_objects_as_they_are(tmp_path):
    site = "profile-t4-k3s-serve"
    objects = render_site(tmp_path, site, SITE_VARIANTS[site])
    assert plugin.inference_service(objects, False) == objects


def test_the_component_without_the_setting_is_refused(objects):
    with pytest.raises(plugin.InferenceServiceError, match="workloads_inference_service is false.*components/infer"):
        plugin.inference_service(objects, False)


def test_the_setting_without_the_component_is_refused(objects):
    without = [o for o in objects if o["kind"] != "InferenceService"]
    with pytest.raises(plugin.InferenceServiceError, match="must include k8s/components/inferenceservice"):
        plugin.inference_service(without, True)


@pytest.mark.parametrize("value", ["true", "yes", 1, None])
def test_the_setting_must_be_a_boolean(objects, value):
    with pytest.raises(plugin.InferenceServiceError, match="workloads_inference_service must be true or false"):
        plugin.inference_service(objects, value)


def skeleton(objects: list[dict]) -> dict:
    return find(objects, "InferenceService", "dinops")


def serve_pod(objects: list[dict]) -> dict:
    return pod_spec(find(objects, "Deployment", "dinops-serve"))


# Rules no schema says: each breaks the component's InferenceService or the Deployment one way.
BROKEN = {
    "Knative mode": (
        lambda o: skeleton(o)["metadata"]["annotations"].update({"serving.kserve.io/deploymentMode": "Knative"}),
        "deploymentMode: Standard",
    ),
    "no mode": (
        lambda o: skeleton(o)["metadata"]["annotations"].pop("serving.kserve.io/deploymentMode"),
        "deploymentMode: Standard",
    ),
    "container named otherwise": (
        lambda o: skeleton(o)["spec"]["predictor"]["containers"][0].update({"name": "serve"}),
        "one container, named kserve-container",
    ),
    "two containers": (
        lambda o: skeleton(o)["spec"]["predictor"]["containers"].append({"name": "sidecar", "image": "x"}),
        "one container, named kserve-container",
    ),
    "port declared twice": (
        lambda o: skeleton(o)["spec"]["predictor"]["containers"][0]["ports"].append({"containerPort": 9000}),
        "declare its port once",
    ),
    "port setting elsewhere": (
        lambda o: skeleton(o)["spec"]["predictor"]["containers"][0]["env"][0].update({"value": "0.0.0.0:8000"}),
        "DINO_BIND to the declared port 8080",
    ),
    "probe on another port": (
        lambda o: skeleton(o)["spec"]["predictor"]["containers"][0]["readinessProbe"]["httpGet"].update(port=8000),
        "readinessProbe of kserve-container asks port 8000",
    ),
    "image in the component": (
        lambda o: skeleton(o)["spec"]["predictor"]["containers"][0].update({"image": "other:1"}),
        "kserve-container sets image; it comes from the Deployment dinops-serve",
    ),
    "replicas in the component": (
        lambda o: skeleton(o)["spec"]["predictor"].update({"minReplicas": 2}),
        "predictor sets minReplicas; it comes from the Deployment dinops-serve",
    ),
    "volumes in the component": (
        lambda o: skeleton(o)["spec"]["predictor"].update({"volumes": []}),
        "predictor sets volumes",
    ),
    "another namespace": (
        lambda o: skeleton(o)["metadata"].update({"namespace": "kserve"}),
        "namespace 'kserve' is not dinops-serve's 'dinops'",
    ),
    "a second container in the pod": (
        lambda o: serve_pod(o)["containers"].append({"name": "sidecar", "image": "x"}),
        "a pod of one container",
    ),
    "a pod field the predictor lacks": (
        lambda o: serve_pod(o).update({"ephemeralContainers": []}),
        "the pod's ephemeralContainers has no place",
    ),
    "a Deployment field KServe lacks": (
        lambda o: find(o, "Deployment", "dinops-serve")["spec"].update({"minReadySeconds": 10}),
        "minReadySeconds has no place",
    ),
    "STORAGE_URI": (
        lambda o: serve_pod(o)["containers"][0].setdefault("env", []).append({"name": "STORAGE_URI", "value": "s3://b/m"}),
        "STORAGE_URI cannot go to an InferenceService: it would start KServe's storage initializer",
    ),
    "PYTHONPATH": (
        lambda o: serve_pod(o)["containers"][0].setdefault("env", []).append({"name": "PYTHONPATH", "value": "/x"}),
        "PYTHONPATH cannot go to an InferenceService: KServe's webhook refuses it",
    ),
    "PROTOCOL": (
        lambda o: serve_pod(o)["containers"][0].setdefault("env", []).append({"name": "PROTOCOL", "value": "grpc"}),
        "PROTOCOL as the predictor's protocol, v1 or v2; got 'grpc'",
    ),
    "client still on dinops-serve": (
        lambda o: next(c for c in o if c["metadata"]["name"].startswith("dinops-client-config"))["data"].update(
            {"DINO_API_URL": "http://dinops-serve:8000"}
        ),
        "DINO_API_URL 'http://dinops-serve:8000' names the Service dinops-serve",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_what_a_schema_cannot_say_is_refused(objects, case):
    breaks, message = BROKEN[case]
    breaks(objects)
    with pytest.raises(plugin.InferenceServiceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plugin.inference_service(objects, True)


def test_the_legacy_mode_name_is_accepted(objects):
    skeleton(objects)["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] = "RawDeployment"
    assert predictor(plugin.inference_service(objects, True))["containers"][0]["name"] == "kserve-container"


def test_the_component_is_a_kustomize_component():
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    assert kustomization["resources"] == ["inferenceservice.yaml", "service-predictor-metrics.yaml"]


def test_ansible_finds_the_filter():
    assert plugin.FilterModule().filters() == {"dinops_inference_service": plugin.inference_service}


def test_the_layer_adds_the_component_only_with_the_setting():
    name = KSERVE_SITES[0]
    without = workloads_filters.site_kustomization(SITE_VARIANTS[name])
    assert not any("inferenceservice" in c for c in without.get("components", []))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"overlay": "docker-gpu", "cluster": "docker"}, "workloads_inference_service needs KServe on a Kubernetes"),
        ({"config": {"client": {"DINO_API_URL": "http://elsewhere"}}}, "DINO_API_URL .* and workloads_inference_ser"),
    ],
)
def test_the_layer_refuses_what_cannot_be_an_inference_service(change, message):
    settings = {**SITE_VARIANTS[KSERVE_SITES[0]], **change, "inference_service": True}
    with pytest.raises(Exception, match=message):
        workloads_filters.site_kustomization(settings)
