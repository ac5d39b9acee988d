"""From a verified bundle to the files the role applies, and what a teardown removes.

``dinops_platform_render``        the bundle rendered with the role's settings: per component a file of CRDs and
                                  Namespaces (applied first, CRDs waited for) and a file of everything else, the
                                  images found (checked against the pinned list), the mirror's pairs and the
                                  inventory of objects a teardown reads.
``dinops_platform_teardown_plan`` what a teardown deletes from that inventory, in order.

What rendering changes in the upstream manifests, each a setting of the role:

- Trainer: only the ClusterTrainingRuntimes named in platform_trainer_runtimes (default torch-distributed).
- Katib: storageClassName of its claim (katib-mysql) when platform_katib_storage_class is set (empty: the cluster's
  default class); ``init.controller.injectSecurityContext`` in katib-config (platform_katib_inject_security_context):
  the metrics collector sidecar then copies the trial container's securityContext
  (kubeflow/katib@v0.19.0:pkg/webhook/v1beta1/pod/inject_webhook.go), which dinops' namespace needs (its pods must
  meet the restricted Pod Security Standard, k8s/base/namespace.yaml).
- Training Operator: ``--pytorch-init-container-image`` names the PyTorchJob workers' init container image (the
  default alpine:3.10 is compiled in, kubeflow/trainer@v1.9.4:pkg/config/config.go, so a mirror would not see it),
  and the init container template (read from /etc/config/initContainer.yaml, pkg/controller.v1/pytorch/
  initcontainer.go) is the compiled-in one plus a restricted securityContext, from a ConfigMap.
- Controllers that read their configuration once at start get a hash of it in their pod template
  (``dinops.io/config-sha256``), so that a changed setting rolls them: katib-controller reads katib-config's
  ``init`` section once (kubeflow/katib@v0.19.0:cmd/katib-controller/v1beta1/main.go GetInitConfigData), the
  Training Operator its init-container template and image once (kubeflow/trainer@v1.9.4:
  pkg/controller.v1/pytorch/initcontainer.go, a sync.Once). KServe re-reads inferenceservice-config on every
  reconcile (kserve/kserve@v0.20.0:pkg/controller/v1beta1/inferenceservice/controller.go) and is left alone.
- Katib: its own Namespace without the metrics-collector injection label its release gives it
  (katib_namespace_unlabelled), and the trials' Namespace labelled only while a search is asked for
  (trial_namespace): Katib's pod webhook fails closed for every pod of a labelled namespace.
- Budget: each component's Deployments and StatefulSets request no more than platform_releases.<component>.pods,
  which the workloads stage reserves on the node (budget_problems).
- Katib: katib-controller's pod template names the trial-kind operators installed with it
  (``dinops.io/trial-kind-operators``): it watches a trial kind only when its CRD is served at its start
  (kubeflow/katib@v0.19.0:pkg/controller.v1beta1/trial/trial_controller.go), so adding Trainer or the Training
  Operator later rolls it, after their CRDs (platform_releases puts them before Katib).
- KServe: inferenceservice-config ``deploy.defaultDeploymentMode`` (platform_kserve_deployment_mode, Standard)
  and ``ingress.disableIngressCreation`` (platform_kserve_disable_ingress_creation): facts 3.1.
- Every namespace an object names and no object creates gets a Namespace (kserve.yaml has none).
- platform_image_mirror: every image reference rewritten (filter_plugins/platform_images.py).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import yaml

FOUNDATION_KINDS = ("CustomResourceDefinition", "Namespace")
WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
# Namespaces every cluster has (https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/
# #initial-namespaces): never created, never deleted by the role.
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
FIELD_MANAGER = "dinops-platform-{component}"
# kubeflow/trainer@v1.9.4: cmd/training-operator.v1/main.go (flags), pkg/config/config.go (defaults),
# pkg/controller.v1/pytorch/initcontainer.go (the template and where it is read from).
TRAINING_OPERATOR = {"deployment": "training-operator", "container": "training-operator"}
INIT_CONTAINER_IMAGE = "alpine:3.10"
INIT_CONTAINER_DIR = "/etc/config"
INIT_CONTAINER_CONFIG_MAP = "training-operator-pytorch-init-container"
# The compiled-in template with a securityContext that the restricted Pod Security Standard admits
# (https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted); nobody (65534) can nslookup.
INIT_CONTAINER_COMMAND = (
    "err=1;for i in $(seq {{.MaxTries}}); do if nslookup {{.MasterAddr}}; then err=0 && break; fi;"
    "echo waiting for master; sleep 2; done; exit $err"
)
INIT_CONTAINER_TEMPLATE = f"""\
- name: init-pytorch
  image: {{{{.InitContainerImage}}}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  securityContext:
    runAsNonRoot: true
    runAsUser: 65534
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
    seccompProfile:
      type: RuntimeDefault
  command: ['sh', '-c', '{INIT_CONTAINER_COMMAND}']
"""
KATIB_CONFIG = ("katib-config", "katib-config.yaml")
KATIB_CONTROLLER = "katib-controller"
KATIB_INJECTION_LABEL = "katib.kubeflow.org/metrics-collector-injection"
# The components whose kinds Katib runs as trials (TrainJob, PyTorchJob; Job is built in).
TRIAL_KIND_OPERATORS = ("trainer", "training_operator")
TRIAL_KIND_ANNOTATION = "dinops.io/trial-kind-operators"
CONFIG_HASH_ANNOTATION = "dinops.io/config-sha256"
KSERVE_CONFIG = "inferenceservice-config"
KSERVE_MODES = ("Standard", "RawDeployment", "Knative", "Serverless")


class RenderError(ValueError):
    """A manifest or a setting the role cannot render; the message names it."""


@functools.cache
def _workloads() -> Any:
    """The workloads role's quantity parsing (quantities.py), the one the node budget uses."""
    path = Path(__file__).resolve().parents[2] / "workloads" / "filter_plugins" / "quantities.py"
    spec = importlib.util.spec_from_file_location("dinops_workloads_for_platform_render", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _images() -> Any:
    path = Path(__file__).with_name("platform_images.py")
    spec = importlib.util.spec_from_file_location("dinops_platform_images_for_render", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _namespace(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def load_component(bundle_dir: str, name: str, release: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of one component's bundle files, in file order (libyaml's loader: the files are megabytes)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    objects = []
    for source in release["sources"]:
        path = Path(bundle_dir) / name / source["file"]
        with path.open(encoding="utf-8") as handle:
            documents = [doc for doc in yaml.load_all(handle, Loader=loader) if doc is not None]
        for doc in documents:
            if not isinstance(doc, dict) or not doc.get("kind") or not doc.get("apiVersion") or not _name(doc):
                raise RenderError(f"{path}: a document that is not a Kubernetes object: {str(doc)[:200]}")
            if doc["kind"].endswith("List"):
                raise RenderError(f"{path}: a {doc['kind']}; the bundle holds one object per document")
        objects.extend(documents)
    return objects


def select_runtimes(objects: list[dict[str, Any]], wanted: list[str]) -> list[dict[str, Any]]:
    """Only the ClusterTrainingRuntimes named in ``wanted``; a name the release lacks is refused."""
    available = [_name(obj) for obj in objects if obj.get("kind") == "ClusterTrainingRuntime"]
    missing = sorted(set(wanted or []) - set(available))
    if missing:
        raise RenderError(
            f"platform_trainer_runtimes names {', '.join(missing)}, which the release does not ship "
            f"(it has {', '.join(sorted(available))})"
        )
    return [obj for obj in objects if obj.get("kind") != "ClusterTrainingRuntime" or _name(obj) in wanted]


def set_storage_class(objects: list[dict[str, Any]], storage_class: str) -> list[dict[str, Any]]:
    """Every PersistentVolumeClaim on ``storage_class``; empty leaves them to the cluster's default class."""
    if not storage_class:
        return objects
    result = []
    for obj in objects:
        if obj.get("kind") == "PersistentVolumeClaim":
            obj = copy.deepcopy(obj)
            obj.setdefault("spec", {})["storageClassName"] = storage_class
        result.append(obj)
    return result


def _find(objects: list[dict[str, Any]], kind: str, name: str, component: str) -> int:
    for index, obj in enumerate(objects):
        if obj.get("kind") == kind and _name(obj) == name:
            return index
    raise RenderError(f"{component}: the release has no {kind} {name}; its manifests changed shape")


def katib_config(objects: list[dict[str, Any]], inject_security_context: bool) -> list[dict[str, Any]]:
    """katib-config with ``init.controller.injectSecurityContext`` (KatibConfig, pkg/apis/config/v1beta1)."""
    objects = list(objects)
    index = _find(objects, "ConfigMap", KATIB_CONFIG[0], "katib")
    config_map = copy.deepcopy(objects[index])
    config = yaml.safe_load((config_map.get("data") or {}).get(KATIB_CONFIG[1], "")) or {}
    config.setdefault("init", {}).setdefault("controller", {})["injectSecurityContext"] = bool(inject_security_context)
    config_map["data"][KATIB_CONFIG[1]] = yaml.safe_dump(config, sort_keys=False)
    objects[index] = config_map
    return objects


def training_operator(objects: list[dict[str, Any]], init_image: str = INIT_CONTAINER_IMAGE) -> list[dict[str, Any]]:
    """The init container image as a flag, and the restricted init container template mounted where it is read."""
    objects = list(objects)
    index = _find(objects, "Deployment", TRAINING_OPERATOR["deployment"], "training_operator")
    deployment = copy.deepcopy(objects[index])
    pod = deployment["spec"]["template"]["spec"]
    container = next((c for c in pod.get("containers", []) if c.get("name") == TRAINING_OPERATOR["container"]), None)
    if container is None:
        raise RenderError("training_operator: its Deployment has no container training-operator")
    args = [a for a in container.get("args") or [] if not str(a).startswith("--pytorch-init-container-image=")]
    container["args"] = [*args, f"--pytorch-init-container-image={init_image}"]
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != INIT_CONTAINER_CONFIG_MAP]
    container["volumeMounts"] = [*mounts, {"name": INIT_CONTAINER_CONFIG_MAP, "mountPath": INIT_CONTAINER_DIR}]
    volumes = [v for v in pod.get("volumes") or [] if v.get("name") != INIT_CONTAINER_CONFIG_MAP]
    pod["volumes"] = [*volumes, {"name": INIT_CONTAINER_CONFIG_MAP, "configMap": {"name": INIT_CONTAINER_CONFIG_MAP}}]
    objects[index] = deployment
    namespace = _namespace(deployment)
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": INIT_CONTAINER_CONFIG_MAP, "namespace": namespace},
            "data": {"initContainer.yaml": INIT_CONTAINER_TEMPLATE},
        }
    )
    return objects


def kserve_config(objects: list[dict[str, Any]], deployment_mode: str, disable_ingress: bool) -> list[dict[str, Any]]:
    """inferenceservice-config's ``deploy`` and ``ingress`` JSON values with the mode and the ingress switch."""
    if deployment_mode not in KSERVE_MODES:
        raise RenderError(f"platform_kserve_deployment_mode {deployment_mode!r}: one of {', '.join(KSERVE_MODES)}")
    objects = list(objects)
    index = _find(objects, "ConfigMap", KSERVE_CONFIG, "kserve")
    config_map = copy.deepcopy(objects[index])
    data = config_map.setdefault("data", {})
    for key, field, value in (
        ("deploy", "defaultDeploymentMode", deployment_mode),
        ("ingress", "disableIngressCreation", bool(disable_ingress)),
    ):
        try:
            document = json.loads(data.get(key, ""))
        except ValueError as error:
            raise RenderError(f"kserve: {KSERVE_CONFIG}.{key} is not JSON ({error}); its manifests changed") from error
        document[field] = value
        data[key] = json.dumps(document, indent=4)
    objects[index] = config_map
    return objects


def _annotate_template(objects: list[dict[str, Any]], name: str, component: str, annotations: dict[str, str]):
    """The Deployment ``name`` with ``annotations`` on its pod template: a changed value rolls its pods."""
    objects = list(objects)
    index = _find(objects, "Deployment", name, component)
    deployment = copy.deepcopy(objects[index])
    metadata = deployment["spec"]["template"].setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    objects[index] = deployment
    return objects


def _config_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def restart_on_change(name: str, objects: list[dict[str, Any]], components: list[str]) -> list[dict[str, Any]]:
    """The pod templates of the controllers that read their configuration once, stamped with what they read (after
    the mirror, which rewrites the images in it), and katib-controller's with the trial-kind operators beside it."""
    if name == "katib":
        config = objects[_find(objects, "ConfigMap", KATIB_CONFIG[0], name)].get("data") or {}
        operators = ",".join(c for c in TRIAL_KIND_OPERATORS if c in components)
        return _annotate_template(
            objects,
            KATIB_CONTROLLER,
            name,
            {CONFIG_HASH_ANNOTATION: _config_hash(config), TRIAL_KIND_ANNOTATION: operators},
        )
    if name == "training_operator":
        config = objects[_find(objects, "ConfigMap", INIT_CONTAINER_CONFIG_MAP, name)].get("data") or {}
        deployment = objects[_find(objects, "Deployment", TRAINING_OPERATOR["deployment"], name)]
        container = next(
            c
            for c in deployment["spec"]["template"]["spec"]["containers"]
            if c["name"] == TRAINING_OPERATOR["container"]
        )
        return _annotate_template(
            objects,
            TRAINING_OPERATOR["deployment"],
            name,
            {CONFIG_HASH_ANNOTATION: _config_hash(config, container.get("args") or [])},
        )
    return objects


def pod_requests(obj: dict[str, Any]) -> dict[str, int]:
    """What a Deployment's or StatefulSet's pods request in all, as the scheduler counts each pod (the larger of the
    containers' sum and the biggest init container), times its replicas."""
    quantities = _workloads()
    pod = obj["spec"]["template"]["spec"]

    def of(container: dict[str, Any]) -> tuple[int, int]:
        requests = (container.get("resources") or {}).get("requests") or {}
        return quantities.cpu_m(requests.get("cpu", "0")), quantities.quantity_mi(requests.get("memory", "0"))

    main = [of(c) for c in pod.get("containers") or []]
    init = [of(c) for c in pod.get("initContainers") or []]
    replicas = int(obj["spec"].get("replicas", 1))
    return {
        key: replicas * max([sum(c[index] for c in main)] + [c[index] for c in init])
        for index, key in enumerate(("cpu_m", "memory_mi"))
    }


def budget_problems(name: str, objects: list[dict[str, Any]], release: dict[str, Any]) -> list[str]:
    """The workloads of a rendered component whose pods request more than platform_releases.<name>.pods pins: the
    node budget (roles/workloads/filter_plugins/node_budget.py platform_reserve) would undercount them and leave
    dinops pods Pending. DaemonSets are left out (KServe's runs only on nodes labelled for local models)."""
    pinned = release.get("pods") or {}
    problems = []
    for obj in objects:
        if obj.get("kind") not in ("Deployment", "StatefulSet"):
            continue
        requested = pod_requests(obj)
        budget = pinned.get(_name(obj)) or {"cpu_m": 0, "memory_mi": 0}
        if any(requested[key] > int(budget[key]) for key in requested):
            problems.append(
                f"{name}: {obj['kind']} {_name(obj)} requests {requested['cpu_m']}m CPU and "
                f"{requested['memory_mi']}Mi memory, roles/platform/vars/main.yml pins {budget['cpu_m']}m and "
                f"{budget['memory_mi']}Mi (platform_releases.{name}.pods)"
            )
    return problems


def trial_namespace(name: str, search: bool) -> dict[str, Any]:
    """The trials' Namespace as Katib's field manager applies it: labelled for the collector's injection only while a
    search is asked for; without the label, server-side apply removes the one this manager set in an earlier run."""
    namespace: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    if search:
        namespace["metadata"]["labels"] = {KATIB_INJECTION_LABEL: "enabled"}
    return namespace


def katib_namespace_unlabelled(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Katib's own Namespace without the injection label its release gives it (kubeflow/katib@v0.19.0:
    manifests/v1beta1/components/namespace/namespace.yaml). The pod webhook's matchCondition exempts only requests of
    katib-controller's service account, not the ReplicaSet controller that creates katib-controller's own pods: with
    the label, a katib-controller pod re-created while none serves (drain, eviction, a rollout after a missed start)
    needs the webhook it would serve. No trial runs in Katib's namespace."""
    result = []
    for obj in objects:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if obj.get("kind") == "Namespace" and KATIB_INJECTION_LABEL in labels:
            obj = copy.deepcopy(obj)
            del obj["metadata"]["labels"][KATIB_INJECTION_LABEL]
        result.append(obj)
    return result


def ensure_namespaces(objects: list[dict[str, Any]], created: set[str]) -> list[dict[str, Any]]:
    """A Namespace first for every namespace the objects use that neither they nor ``created`` create, except the
    cluster's own (cert-manager keeps its leader election Role in kube-system)."""
    own = {_name(obj) for obj in objects if obj.get("kind") == "Namespace"}
    used = sorted({_namespace(obj) for obj in objects if _namespace(obj)} - own - created - set(SYSTEM_NAMESPACES))
    added = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in used]
    return added + list(objects)


def dump(objects: list[dict[str, Any]]) -> str:
    """A YAML stream of JSON documents, one object each: kubectl reads it as YAML (JSON is YAML; kubectl splits
    documents at ``---`` lines, and a JSON string holds no raw newline), and json writes megabytes of CRDs in a
    fraction of the time a YAML emitter takes."""
    return "".join(f"---\n{json.dumps(obj, indent=1)}\n" for obj in objects or [])


def _inventory(component: str, obj: dict[str, Any]) -> dict[str, str]:
    entry = {"component": component, "apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": _name(obj)}
    if _namespace(obj):
        entry["namespace"] = _namespace(obj)
    return entry


def _patched(name: str, objects: list[dict[str, Any]], settings: dict[str, Any]) -> list[dict[str, Any]]:
    if name == "trainer":
        return select_runtimes(objects, list(settings.get("trainer_runtimes") or []))
    if name == "katib":
        objects = set_storage_class(objects, str(settings.get("storage_class") or ""))
        objects = katib_namespace_unlabelled(objects)
        return katib_config(objects, bool(settings.get("katib_inject_security_context", True)))
    if name == "training_operator":
        return training_operator(objects)
    if name == "kserve":
        return kserve_config(
            objects,
            str(settings.get("kserve_deployment_mode", "Standard")),
            bool(settings.get("kserve_disable_ingress_creation", True)),
        )
    return objects


def render(bundle_dir: str, settings: dict[str, Any]) -> dict[str, Any]:
    """What the role writes and applies, from a bundle that bundle_check accepted.

    ``settings``: releases (platform_releases), components (enabled, in order), trainer_runtimes, storage_class,
    katib_inject_security_context, kserve_deployment_mode, kserve_disable_ingress_creation, mirror.
    Returns {steps: [{component, field_manager, crds_file, objects_file, crds, workloads: {namespace: ["Kind name"]}}],
    files: {name: text},
    images: [references as written], image_list: [references in full, for images.txt],
    unlisted: ["<reference> (<component>)"], budget: [what requests more than the pinned pods table],
    mirror: ["source destination"] (with a mirror),
    lists: {"images.txt": text, "images-mirror.txt": text (with a mirror)},
    inventory: [{component, apiVersion, kind, namespace?, name}]}.
    """
    images = _images()
    releases = settings["releases"]
    mirror = str(settings.get("mirror") or "").strip()
    if mirror:
        images.check_mirror(mirror)
    steps, files, inventory, found, unlisted, budget = [], {}, [], set(), [], []
    created: set[str] = set()
    for name in settings["components"]:
        release = releases[name]
        objects = _patched(name, load_component(bundle_dir, name, release), settings)
        budget.extend(budget_problems(name, objects, release))
        objects = ensure_namespaces(objects, created)
        component_images = images.images(objects)
        found.update(component_images)
        listed = list(release.get("images") or []) + list(release.get("images_on_demand") or [])
        unlisted.extend(f"{reference} ({name})" for reference in images.unlisted_images(objects, listed))
        objects = images.mirror_objects(objects, mirror)
        objects = restart_on_change(name, objects, list(settings["components"]))
        foundation = [obj for obj in objects if obj["kind"] in FOUNDATION_KINDS]
        rest = [obj for obj in objects if obj["kind"] not in FOUNDATION_KINDS]
        created.update(_name(obj) for obj in foundation if obj["kind"] == "Namespace")
        step = {
            "component": name,
            "field_manager": FIELD_MANAGER.format(component=name.replace("_", "-")),
            "crds_file": f"{len(steps) + 1:02d}-{name}-crds-namespaces.yaml",
            "objects_file": f"{len(steps) + 1:02d}-{name}-objects.yaml",
            "crds": [_name(obj) for obj in foundation if obj["kind"] == "CustomResourceDefinition"],
            "workloads": {
                namespace: sorted(
                    f"{obj['kind']} {_name(obj)}"
                    for obj in rest
                    if obj["kind"] in WORKLOAD_KINDS and _namespace(obj) == namespace
                )
                for namespace in sorted({_namespace(obj) for obj in rest if obj["kind"] in WORKLOAD_KINDS})
            },
        }
        files[step["crds_file"]] = dump(foundation)
        files[step["objects_file"]] = dump(rest)
        inventory.extend(_inventory(name, obj) for obj in objects)
        steps.append(step)
    return {
        "steps": steps,
        "files": files,
        "images": sorted(found),
        "unlisted": unlisted,
        "budget": budget,
        "image_list": images.mirror_list(sorted(found)),
        "mirror": images.mirror_list(sorted(found), mirror) if mirror else [],
        "lists": _image_lists(
            images.mirror_list(sorted(found)), images.mirror_list(sorted(found), mirror) if mirror else []
        ),
        "inventory": inventory,
    }


def _image_lists(full: list[str], mirror: list[str]) -> dict[str, str]:
    """images.txt (every image in full, one per line) and, with a mirror, images-mirror.txt ("source destination")."""
    lists = {"images.txt": "".join(f"{line}\n" for line in full)}
    if mirror:
        lists["images-mirror.txt"] = "".join(f"{line}\n" for line in mirror)
    return lists


def teardown_plan(inventory: list[dict[str, Any]], delete_data: bool = False) -> list[dict[str, Any]]:
    """Groups to delete, in order: the webhooks (a webhook whose server is gone blocks what it admits), then the
    rest of the operators (controllers, their Services, RBAC, configuration, runtimes), then, with ``delete_data``
    only, the claims (Katib's MySQL) and the operators' namespaces. CRDs are never deleted: deleting one deletes
    every object of its kind (every TrainJob, Experiment, InferenceService)."""
    entries = [entry for entry in inventory or [] if isinstance(entry, dict) and entry.get("kind")]
    webhooks = [e for e in entries if e["kind"] in WEBHOOK_KINDS]
    kept = (*WEBHOOK_KINDS, "CustomResourceDefinition", "Namespace", "PersistentVolumeClaim")
    operators = [e for e in entries if e["kind"] not in kept]
    data = [e for e in entries if e["kind"] == "PersistentVolumeClaim"]
    namespaces = [e for e in entries if e["kind"] == "Namespace" and e["name"] not in SYSTEM_NAMESPACES]
    groups = [
        {"name": "webhooks", "objects": webhooks},
        {"name": "operators", "objects": operators},
    ]
    if delete_data:
        groups += [{"name": "data", "objects": data}, {"name": "namespaces", "objects": _unique(namespaces)}]
    return [
        {"name": group["name"], "file": f"teardown-{index + 1}-{group['name']}.yaml", "text": dump(_stubs(group))}
        for index, group in enumerate(groups)
        if group["objects"]
    ]


def _unique(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, result = set(), []
    for entry in entries:
        key = (entry["apiVersion"], entry["kind"], entry.get("namespace", ""), entry["name"])
        if key not in seen:
            seen.add(key)
            result.append(entry)
    return result


def _stubs(group: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``kubectl delete -f`` needs of each object: its type, name and namespace."""
    stubs = []
    for entry in _unique(group["objects"]):
        metadata = {"name": entry["name"]}
        if entry.get("namespace"):
            metadata["namespace"] = entry["namespace"]
        stubs.append({"apiVersion": entry["apiVersion"], "kind": entry["kind"], "metadata": metadata})
    return stubs


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_platform_render": render,
            "dinops_platform_teardown_plan": teardown_plan,
            "dinops_platform_trial_namespace": trial_namespace,
        }
