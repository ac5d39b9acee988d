"""DINO served by a KServe InferenceService, folded from the rendered inference Deployment.

``dinops_inference_service``  ``objects | dinops_inference_service(enabled)``: the rendered objects of the layer
                              (kustomize output, every layer applied) with, when ``enabled``
                              (workloads_inference_service), the Deployment dinops-serve's pod folded into the
                              InferenceService ``dinops`` of k8s/components/inferenceservice, the Deployment and the
                              Service dinops-serve dropped and the Ingress repointed. A pure function: the input is
                              not changed.

The fold, field by field (KServe v0.20.0, serving.kserve.io/v1beta1; the predictor is the custom-container form,
``PodSpec`` inlined plus ``ComponentExtensionSpec``: kserve@v0.20.0:pkg/apis/serving/v1beta1/predictor.go,
component.go, podspec.go):

- ``containers[0]`` (``kserve-container``): every field of the Deployment's only container (image,
  imagePullPolicy, command, args, env, envFrom, resources, volumeMounts, securityContext, ...) except its name,
  ports and probes, which the component gives (port 8080, the Open Inference Protocol health routes); the
  component's env entries (the port setting DINO_BIND, the model's name DINO_MODEL_NAME) win over the
  Deployment's of the same name.
- the predictor: every field of the Deployment's pod spec but the containers (volumes, initContainers,
  securityContext, nodeSelector, affinity, tolerations, serviceAccountName, terminationGracePeriodSeconds,
  runtimeClassName, ...), the pod template's labels and annotations (the component's win), ``minReplicas`` =
  ``maxReplicas`` = the Deployment's replicas (the autoscaler class is ``none``: KServe sets the Deployment's
  replicas to minReplicas) and ``deploymentStrategy`` = its strategy (Recreate: one model per GPU; KServe's default,
  RollingUpdate 25%/25%, starts a second pod that waits for the GPU the first one holds:
  pkg/controller/v1beta1/inferenceservice/reconcilers/deployment/deployment_reconciler.go).
- the InferenceService takes the Deployment's namespace.
- an Ingress backend on the Service dinops-serve moves to dinops-predictor port 80, the Service KServe's Standard
  mode creates (``<name>-predictor``, port 80 -> the container port: pkg/constants/constants.go
  PredictorServiceName, CommonDefaultHttpPort; reconcilers/service/service_reconciler.go createDefaultSvc).

What the component and the Deployment both give is refused, so that each field has one source. Refused with a
message (``InferenceServiceError``, a ValueError): a layer with no Deployment dinops-serve (the profile runs no
inference), an InferenceService without the setting or the setting without the component, a skeleton that is not a
one-container ``kserve-container`` with one port in Standard mode, a pod field the predictor has no place for, env
names KServe gives a meaning to (STORAGE_URI starts its storage initializer, PYTHONPATH is refused by its webhook,
PROTOCOL must be v1 or v2), and a web client that still calls dinops-serve.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SETTING = "workloads_inference_service"
COMPONENT = "k8s/components/inferenceservice"
ISVC_KIND = ("serving.kserve.io", "InferenceService")
ISVC_NAME = "dinops"
SERVE = "dinops-serve"
# KServe Standard mode's Service for the predictor and its port.
PREDICTOR_SERVICE = "dinops-predictor"
PREDICTOR_SERVICE_PORT = 80
CLIENT_CONFIG = "dinops-client-config"
CLIENT_URL_KEY = "DINO_API_URL"
# The container KServe takes as the model server of a custom predictor (constants.go InferenceServiceContainerName).
CONTAINER = "kserve-container"
MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
# "RawDeployment" is the legacy name of Standard (constants.go ParseDeploymentMode); Knative/Serverless and
# ModelMesh need other controllers than the platform stage installs.
STANDARD_MODES = ("Standard", "RawDeployment")
PORT_SETTING = "DINO_BIND"
# What the component's kserve-container gives; every other container field comes from the Deployment.
SKELETON_CONTAINER_FIELDS = frozenset({"name", "ports", "env", "startupProbe", "readinessProbe", "livenessProbe"})
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
# The Pod fields of the predictor (kserve@v0.20.0:pkg/apis/serving/v1beta1/podspec.go, as the CRD's schema of
# spec.predictor has them: ephemeralContainers is not there), but containers.
POD_FIELDS = frozenset(
    {
        "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "dnsConfig", "dnsPolicy",
        "enableServiceLinks", "hostAliases", "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname",
        "hostnameOverride", "imagePullSecrets", "initContainers", "nodeName", "nodeSelector", "os", "overhead",
        "preemptionPolicy", "priority", "priorityClassName", "readinessGates", "resourceClaims", "resources",
        "restartPolicy", "runtimeClassName", "schedulerName", "schedulingGates", "securityContext",
        "serviceAccount", "serviceAccountName", "setHostnameAsFQDN", "shareProcessNamespace", "subdomain",
        "terminationGracePeriodSeconds", "tolerations", "topologySpreadConstraints", "volumes",
    }
)  # fmt: skip
# Predictor fields the fold writes from the Deployment's spec.
DEPLOYMENT_FIELDS = {"replicas": ("minReplicas", "maxReplicas"), "strategy": ("deploymentStrategy",)}
# Deployment spec fields with no InferenceService equivalent are refused; these are carried or implied.
DEPLOYMENT_SPEC_FIELDS = frozenset({"replicas", "strategy", "selector", "template"})
# Env names KServe reads on kserve-container (constants.go CustomSpecStorageUriEnvVarKey,
# CustomSpecProtocolEnvVarKey; pkg/validation/env_policy.go DefaultBlockedEnvVars).
REFUSED_ENV = {
    "STORAGE_URI": "it would start KServe's storage initializer, and dinops serve loads and follows its checkpoint "
    "itself (DINO_CHECKPOINT; the reasons are in k8s/components/inferenceservice/kustomization.yaml)",
    "PYTHONPATH": "KServe's webhook refuses it (pkg/validation/env_policy.go)",
}
PROTOCOLS = ("v1", "v2")


def _load(stem: str) -> Any:
    """A sibling filter file, read by path as Ansible loads each plugin file on its own."""
    spec = importlib.util.spec_from_file_location(
        f"dinops_{stem}_for_inference_service", Path(__file__).with_name(f"{stem}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The copy of the objects, as plain data (rendered.py says why not copy.deepcopy).
rendered = _load("rendered")


class InferenceServiceError(ValueError):
    """The InferenceService cannot be folded from these objects; the message says which setting or file."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InferenceServiceError(message)


def _is(obj: dict[str, Any], group: str, kind: str, name: str | None = None) -> bool:
    api_group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    named = name is None or (obj.get("metadata") or {}).get("name") == name
    return api_group == group and obj.get("kind") == kind and named


def inference_service(objects: list[dict[str, Any]], enabled: bool) -> list[dict[str, Any]]:
    """The objects to apply: with ``enabled`` the InferenceService ``dinops`` in place of the Deployment and the
    Service dinops-serve (see the module's docstring); without, the objects as they are."""
    _require(isinstance(enabled, bool), f"{SETTING} must be true or false, got {enabled!r}")
    objects = rendered.plain([obj for obj in objects if obj])
    inference_services = [obj for obj in objects if _is(obj, *ISVC_KIND, ISVC_NAME)]
    if not enabled:
        _require(
            not inference_services,
            f"{SETTING} is false but the rendered objects hold the InferenceService {ISVC_NAME}: the layer includes "
            f"{COMPONENT} only when {SETTING} is true",
        )
        return objects
    _require(
        len(inference_services) == 1,
        f"{SETTING} is true but the rendered objects hold {len(inference_services)} InferenceService "
        f"{ISVC_NAME}: the layer must include {COMPONENT} once",
    )
    deployments = [obj for obj in objects if _is(obj, "apps", "Deployment", SERVE)]
    _require(
        len(deployments) == 1,
        f"{SETTING} is true but this host's profile runs no inference (no Deployment {SERVE} in the rendered "
        f"objects): add inference to gpu_profile.workloads, or set {SETTING} false",
    )
    folded = _fold(inference_services[0], deployments[0])
    result = []
    for obj in objects:
        if _is(obj, *ISVC_KIND, ISVC_NAME):
            result.append(folded)
        elif _is(obj, "apps", "Deployment", SERVE) or _is(obj, "", "Service", SERVE):
            continue
        else:
            if _is(obj, "networking.k8s.io", "Ingress"):
                _repoint_ingress(obj)
            if obj.get("kind") == "ConfigMap" and obj["metadata"].get("name", "").startswith(CLIENT_CONFIG):
                _check_client(obj)
            result.append(obj)
    return result


def _fold(isvc: dict[str, Any], deployment: dict[str, Any]) -> dict[str, Any]:
    metadata = isvc.setdefault("metadata", {})
    mode = (metadata.get("annotations") or {}).get(MODE_ANNOTATION)
    _require(
        mode in STANDARD_MODES,
        f"{COMPONENT}: the InferenceService needs the annotation {MODE_ANNOTATION}: Standard (KServe's shipped "
        f"default is Knative, which the platform stage does not install), got {mode!r}",
    )
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    skeleton = _skeleton_container(predictor)
    spec = deployment["spec"]
    unknown = sorted(set(spec) - DEPLOYMENT_SPEC_FIELDS)
    _require(not unknown, f"Deployment {SERVE}: {', '.join(unknown)} has no place in an InferenceService")
    template = spec["template"]
    pod = template["spec"]
    unknown = sorted(set(pod) - POD_FIELDS - {"containers"})
    _require(not unknown, f"Deployment {SERVE}: the pod's {', '.join(unknown)} has no place in a KServe predictor")
    _require(len(pod["containers"]) == 1, f"Deployment {SERVE}: the fold takes a pod of one container")
    both = sorted(set(predictor) & (POD_FIELDS | {f for fields in DEPLOYMENT_FIELDS.values() for f in fields}))
    _require(not both, f"{COMPONENT}: the predictor sets {', '.join(both)}; it comes from the Deployment {SERVE}")

    container = {key: value for key, value in pod["containers"][0].items() if key not in SKELETON_CONTAINER_FIELDS}
    container = {"name": CONTAINER, **container, "ports": skeleton["ports"]}
    env = {item["name"]: item for item in pod["containers"][0].get("env") or []}
    env.update({item["name"]: item for item in skeleton.get("env") or []})
    if env:
        container["env"] = list(env.values())
    container.update({probe: skeleton[probe] for probe in PROBES if probe in skeleton})
    _check_env(container)

    folded = {key: value for key, value in predictor.items() if key != "containers"}
    for key in ("labels", "annotations"):
        merged = {**((template.get("metadata") or {}).get(key) or {}), **(predictor.get(key) or {})}
        if merged:
            folded[key] = merged
    replicas = spec.get("replicas", 1)
    folded.update(minReplicas=replicas, maxReplicas=replicas)
    if "strategy" in spec:
        folded["deploymentStrategy"] = spec["strategy"]
    folded.update({key: value for key, value in pod.items() if key != "containers"})
    folded["containers"] = [container]

    namespace = deployment["metadata"].get("namespace")
    _require(
        metadata.get("namespace") in (None, namespace),
        f"{COMPONENT}: the InferenceService's namespace {metadata.get('namespace')!r} is not {SERVE}'s {namespace!r}",
    )
    if namespace:
        metadata["namespace"] = namespace
    isvc["spec"] = {**isvc.get("spec", {}), "predictor": folded}
    return isvc


def _skeleton_container(predictor: dict[str, Any]) -> dict[str, Any]:
    """The component's kserve-container, with the rules KServe's schema cannot say."""
    containers = predictor.get("containers") or []
    _require(
        len(containers) == 1 and containers[0].get("name") == CONTAINER,
        f"{COMPONENT}: the predictor must have one container, named {CONTAINER} (KServe finds the model server by "
        f"that name), got {[c.get('name') for c in containers]}",
    )
    skeleton = containers[0]
    extra = sorted(set(skeleton) - SKELETON_CONTAINER_FIELDS)
    _require(not extra, f"{COMPONENT}: {CONTAINER} sets {', '.join(extra)}; it comes from the Deployment {SERVE}")
    ports = skeleton.get("ports") or []
    _require(len(ports) == 1, f"{COMPONENT}: {CONTAINER} must declare its port once (KServe's Service targets it)")
    port = ports[0]
    for probe in PROBES:
        target = ((skeleton.get(probe) or {}).get("httpGet") or {}).get("port")
        _require(
            probe not in skeleton or target in (port.get("name"), port.get("containerPort")),
            f"{COMPONENT}: the {probe} of {CONTAINER} asks port {target!r}, not the declared port",
        )
    bind = {item["name"]: item.get("value") for item in skeleton.get("env") or []}.get(PORT_SETTING) or ""
    _require(
        bind.rpartition(":")[2] == str(port.get("containerPort")),
        f"{COMPONENT}: {CONTAINER} must set {PORT_SETTING} to the declared port {port.get('containerPort')} "
        f"(dinops serve listens there), got {bind!r}",
    )
    return skeleton


def _check_env(container: dict[str, Any]) -> None:
    env = {item["name"]: item.get("value") for item in container.get("env") or []}
    for name, why in REFUSED_ENV.items():
        _require(name not in env, f"Deployment {SERVE}: the env {name} cannot go to an InferenceService: {why}")
    protocol = env.get("PROTOCOL")
    _require(
        protocol is None or protocol in PROTOCOLS,
        f"Deployment {SERVE}: KServe reads the env PROTOCOL as the predictor's protocol, v1 or v2; got {protocol!r}",
    )


def _repoint_ingress(ingress: dict[str, Any]) -> None:
    spec = ingress.get("spec") or {}
    backends = [spec.get("defaultBackend")]
    for rule in spec.get("rules") or []:
        backends.extend(path.get("backend") for path in (rule.get("http") or {}).get("paths") or [])
    for backend in backends:
        if backend and (backend.get("service") or {}).get("name") == SERVE:
            backend["service"] = {"name": PREDICTOR_SERVICE, "port": {"number": PREDICTOR_SERVICE_PORT}}


def _check_client(config: dict[str, Any]) -> None:
    url = (config.get("data") or {}).get(CLIENT_URL_KEY, "")
    _require(
        urlsplit(url).hostname != SERVE,
        f"ConfigMap {config['metadata']['name']}: the web client's {CLIENT_URL_KEY} {url!r} names the Service {SERVE} "
        f"that the InferenceService replaces: the layer must include {COMPONENT}, which sets it to "
        f"http://{PREDICTOR_SERVICE}",
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_inference_service": inference_service}
