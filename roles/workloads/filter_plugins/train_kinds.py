"""Training as a Kubeflow kind and hyperparameter search as a Katib Experiment, folded from the rendered Job.

The batch Job ``dinops-train``, rendered by kustomize with every layer (GPUs, /dev/shm, NFS, the S3 Secret, the
sized resources, images, placement), stays the one description of training. The components
``k8s/components/{trainjob,pytorchjob,katib-experiment}`` hold only what is specific to each kind; after kustomize,
``dinops_train_kinds`` folds the Job's pod template into them and drops what they replace. A pure function of the
rendered objects and the settings, so that pytest checks each kind offline (tests/k8s/test_train_kinds.py).

``dinops_train_kinds(objects, settings)``   the objects to apply (see ``train_kinds``).
``dinops_kubeflow_crds(objects)``           the CRDs of the Kubeflow kinds, those the objects need, what to set.
``dinops_objects_to_delete(desired, live)`` what apply.yml deletes before applying: changed, failed, replaced.

Where each part of the Job goes:

- TrainJob (Kubeflow Trainer v2.3.0): the pod template, the Job's backoffLimit and podFailurePolicy into the
  replicated Job ``node`` of our TrainingRuntime (container ``train`` renamed ``node``, its args dropped: the
  TrainJob's ``spec.trainer.command`` launches torchrun); the container's resources into ``resourcesPerNode``;
  ``numNodes`` = workloads_train_nodes, ``numProcPerNode`` = the GPUs per node (1 on CPU). Why a runtime of ours
  rather than torch-distributed with runtimePatches: k8s/components/trainjob/kustomization.yaml.
- PyTorchJob (Training Operator v1.9.4): the pod template into the Master and, with workloads_train_nodes > 1,
  workloads_train_nodes - 1 Workers (container ``pytorch``); ``nprocPerNode`` = the GPUs per node; the Job's
  backoffLimit into ``runPolicy.backoffLimit``. Its podFailurePolicy cannot be expressed: a PyTorchJob has none,
  and restartPolicy ExitCode would make a preempted pod fail for good (k8s/components/pytorchjob/pytorchjob.yaml).
  So exit 2 does not fail it at once, and exit 75 (``dinops train``'s EX_TEMPFAIL: its S3 output unreachable beyond
  --s3-retry-minutes, which the batch Job's Ignore rule retries without counting) is restarted by OnFailure and
  counts against ``runPolicy.backoffLimit`` like any failure: a storage outage that outlasts that many restarts
  (each one --s3-retry-minutes or more) fails it. Under torchrun neither code reaches the container's status anyway
  (a failed worker makes torchrun exit 1, docs/training.md), which holds for a TrainJob's node too: its Job keeps the
  rules, renamed.
- Experiment (Katib v0.19.0): a trial is the TrainJob, the PyTorchJob or the batch Job (one GPU, one process) by
  workloads_train_kind, with the search's DINO_* values in its environment and its own output directory; the plain
  training object is not applied (the trials are the training).
"""

from __future__ import annotations

import copy
import importlib.util
import posixpath
import re
from pathlib import Path
from typing import Any


# Sibling filter files, read by path as Ansible loads each plugin file on its own: the quantity parsers and the GPU
# resource (quantities.py), the hash stamped on what is replaced when it changes (jobs.py), the label of the train
# nodes (kind_components.py).
def _load(stem: str) -> Any:
    path = Path(__file__).with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"dinops_{stem}_for_train_kinds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


quantities = _load("quantities")
jobs = _load("jobs")
kind_components = _load("kind_components")
# The waits' reading of a failed Job, TrainJob or PyTorchJob (dinops_failed_jobs).
rollout = _load("rollout")
# The copy of the objects, as plain data (rendered.py says why not copy.deepcopy).
rendered = _load("rendered")

TRAIN_JOB = "dinops-train"
RUNTIME = "dinops-train-runtime"
EXPERIMENT = "dinops-hpo"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
PYTORCH_API = "kubeflow.org/v1"
KATIB_API = "kubeflow.org/v1beta1"
CONTAINER = "train"
# The training container each kind's operator (and Katib) looks for: the Trainer's torch plugin injects PET_* into
# `node` (kubeflow/trainer@v2.3.0:pkg/constants/constants.go Node), the Training Operator's default is `pytorch`
# (kubeflow/trainer@v1.9.4:pkg/apis/kubeflow.org/v1/pytorch_types.go).
KIND_CONTAINERS = {"trainjob": "node", "pytorchjob": "pytorch", "job": CONTAINER}
# The variables torchrun reads, which the operators inject; the Trainer's webhook rejects them in spec.trainer.env
# (kubeflow/trainer@v2.3.0:pkg/runtime/framework/plugins/torch/torch.go Validate, TorchRunReservedEnvNames).
RESERVED_ENV = re.compile(r"^PET_")
# Every field of the Job's spec and of its container the fold knows; anything else is refused by name, so that a
# change to the manifests cannot be dropped silently.
JOB_SPEC_FIELDS = {"template", "backoffLimit", "podFailurePolicy"}
# ports: the trainer's metrics port (k8s/base/job-train.yaml), carried with the pod template into each kind's pods.
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports", "resources",
                    "securityContext", "volumeMounts"}  # fmt: skip
GPU = quantities.GPU_RESOURCE
NO_ISTIO = {"sidecar.istio.io/inject": "false"}

# --- Katib --------------------------------------------------------------------------------------------------------
HPO_ALGORITHMS = ("random", "tpe")  # both served by suggestion-hyperopt (katib-config of v0.19.0)
PARAMETER_TYPES = ("double", "int", "discrete", "categorical")
DISTRIBUTIONS = ("uniform", "logUniform", "normal", "logNormal")
# The DINO_* settings the fold sets itself per trial; a search over them would fight it.
FOLDED_SETTINGS = ("DINO_OUTPUT_DIR", "DINO_RESUME")
# One setting holds the model's DINOConfig overrides ("name=value,..."; a later name wins:
# apps/src/dinops/train/model_setup.py parse_overrides): a search over dn_number appends dn_number=<value>.
OVERRIDES_SETTING = "DINO_MODEL_OVERRIDES"
SETTING = re.compile(r"^DINO_[A-Z0-9_]+$")
OVERRIDE = re.compile(r"^[a-z_][a-z0-9_]*$")
# The trial's own name, a Katib metadata reference (kubeflow/katib@v0.19.0:pkg/controller.v1beta1/consts/const.go
# TrialTemplateMetaKeyOfName): each trial writes to <DINO_OUTPUT_DIR>/hpo/<trial>.
TRIAL_NAME = "trialName"
# successCondition/failureCondition (GJSON on the trial object) and the primary pod by kind: Katib's defaults
# (kubeflow/katib@v0.19.0:pkg/apis/controller/experiments/v1beta1/constants.go), written out.
TRIAL_KINDS = {
    "trainjob": {
        "success": 'status.conditions.#(type=="Complete")#|#(status=="True")#',
        "failure": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
        # The first pod of the replicated Job `node`: the one that prints the metrics (rank 0).
        "pods": {"jobset.sigs.k8s.io/replicatedjob-name": "node", "batch.kubernetes.io/job-completion-index": "0"},
    },
    "pytorchjob": {
        "success": 'status.conditions.#(type=="Succeeded")#|#(status=="True")#',
        "failure": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
        "pods": {"training.kubeflow.org/job-role": "master"},
    },
    "job": {
        "success": 'status.conditions.#(type=="Complete")#|#(status=="True")#',
        "failure": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
        "pods": {},
    },
}
# Katib injects its metrics collector only in namespaces with this label (kubeflow/katib@v0.19.0:
# manifests/v1beta1/components/namespace/namespace.yaml; facts: Katib pitfall 1).
KATIB_NAMESPACE_LABEL = {"katib.kubeflow.org/metrics-collector-injection": "enabled"}
# Pods that Pod Security "restricted" refuses, which the operators create in our namespace:
# - with a search, always: Katib's suggestion Deployment (the algorithm's container and medianstop's), which Katib
#   creates in the Experiment's namespace with no securityContext at all (kubeflow/katib@v0.19.0:
#   pkg/controller.v1beta1/suggestion/composer/composer.go; `git grep SecurityContext
#   pkg/controller.v1beta1/suggestion` finds nothing). The metrics collector sidecar is not one of them when
#   katib-config sets injectSecurityContext (pkg/webhook/v1beta1/pod/inject_webhook.go copies the trial container's),
#   as roles/platform does;
# - PyTorchJob Workers' init-pytorch (kubeflow/trainer@v1.9.4:pkg/controller.v1/pytorch/initcontainer.go), unless
#   the Training Operator runs with the restricted template roles/platform gives it (``restricted_operators``:
#   the platform stage installed the operators; an existing Kubeflow's are not known).
# Then the namespace enforces "baseline" and still warns and audits against "restricted"
# (https://kubernetes.io/docs/concepts/security/pod-security-admission/#pod-security-admission-labels-for-namespaces).
PSA = "pod-security.kubernetes.io/"

# The CRDs of the kinds the role applies, reads (live: the training objects it may replace) or removes, in the order
# a teardown deletes them (the search owns its trials), and what installs them (the platform stage, roles/platform).
_TRAINER = "Kubeflow Trainer v2.3.0 (dinops_platform: true, platform_trainer: true)"
KUBEFLOW_CRDS = (
    ("experiments.kubeflow.org", KATIB_API, "Experiment", True, "workloads_hpo",
     "Katib v0.19.0 (dinops_platform: true, platform_katib: true)"),
    ("trainjobs.trainer.kubeflow.org", TRAINER_API, "TrainJob", True, "workloads_train_kind trainjob", _TRAINER),
    ("pytorchjobs.kubeflow.org", PYTORCH_API, "PyTorchJob", True, "workloads_train_kind pytorchjob",
     "the Training Operator v1.9.4 (dinops_platform: true, platform_training_operator: true)"),
    ("trainingruntimes.trainer.kubeflow.org", TRAINER_API, "TrainingRuntime", False, "workloads_train_kind trainjob",
     _TRAINER),
    # Not a training kind, but checked, read and torn down the same way (filter_plugins/inference_service.py).
    ("inferenceservices.serving.kserve.io", "serving.kserve.io/v1beta1", "InferenceService", False,
     "workloads_inference_service", "KServe v0.20.0 (dinops_platform: true, platform_kserve: true)"),
)  # fmt: skip


class TrainKindsError(ValueError):
    """A setting or a rendered object the fold cannot turn into the kind asked for; the message names it."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise TrainKindsError(message)


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    found = [o for o in objects if o.get("kind") == kind and (o.get("metadata") or {}).get("name") == name]
    _require(len(found) <= 1, f"the layer rendered {len(found)} {kind} objects named {name}")
    return found[0] if found else None


def _int(value: Any, name: str, minimum: int) -> int:
    _require(
        not isinstance(value, bool) and str(value).strip().lstrip("-").isdigit() and int(value) >= minimum,
        f"{name} must be a whole number >= {minimum}, got {value!r}",
    )
    return int(value)


# --- The Job's parts ----------------------------------------------------------------------------------------------
def _job_parts(job: dict[str, Any]) -> dict[str, Any]:
    """The rendered Job's pieces the kinds take, checked: its spec fields, its pod and its training container."""
    spec = job["spec"]
    unknown = sorted(set(spec) - JOB_SPEC_FIELDS)
    _require(not unknown, f"Job {TRAIN_JOB}: the fold into workloads_train_kind does not know spec {unknown}; "
             "teach roles/workloads/filter_plugins/train_kinds.py")  # fmt: skip
    pod = copy.deepcopy(spec["template"])
    containers = pod["spec"]["containers"]
    _require(
        [c["name"] for c in containers] == [CONTAINER],
        f"Job {TRAIN_JOB} must have the one container {CONTAINER!r}, got {[c['name'] for c in containers]}",
    )
    container = containers[0]
    unknown = sorted(set(container) - CONTAINER_FIELDS)
    _require(not unknown, f"Job {TRAIN_JOB} container {CONTAINER}: the fold does not know {unknown}; teach "
             "roles/workloads/filter_plugins/train_kinds.py")  # fmt: skip
    for item in [*pod["spec"].get("initContainers", []), container]:
        reserved = [e["name"] for e in item.get("env") or [] if RESERVED_ENV.match(e["name"])]
        _require(not reserved, f"Job {TRAIN_JOB} container {item['name']} sets {reserved}: torchrun's PET_* "
                 "variables are the operators' (the Trainer's webhook rejects them)")  # fmt: skip
    metadata = job["metadata"]
    return {
        "namespace": metadata.get("namespace"),
        "labels": dict(metadata.get("labels") or {}),
        "spec": spec,
        "pod": pod,
        "container": container,
    }


def _meta(skeleton: dict[str, Any], parts: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The folded object's metadata: its name, the Job's namespace and labels (part-of: found by the teardown)."""
    metadata = copy.deepcopy(skeleton.get("metadata") or {})
    metadata["labels"] = {**parts["labels"], **(metadata.get("labels") or {})}
    if name:
        metadata["labels"]["app.kubernetes.io/name"] = name
    if parts["namespace"]:
        metadata["namespace"] = parts["namespace"]
    return metadata


def _pod_for(parts: dict[str, Any], skeleton_pod: dict[str, Any], container_name: str) -> dict[str, Any]:
    """The Job's pod template under the kind's pod metadata, its container renamed and without the Job's
    restartPolicy (the kind decides) or args (the kind's command launches torchrun)."""
    pod = copy.deepcopy(parts["pod"])
    skeleton_meta = skeleton_pod.get("metadata") or {}
    metadata = pod.setdefault("metadata", {})
    for key in ("labels", "annotations"):
        merged = {**(metadata.get(key) or {}), **(skeleton_meta.get(key) or {})}
        if merged:
            metadata[key] = merged
    skeleton_container = ((skeleton_pod.get("spec") or {}).get("containers") or [{}])[0]
    container = pod["spec"]["containers"][0]
    container.pop("args", None)
    container.update(copy.deepcopy(skeleton_container))
    container["name"] = container_name
    return pod


def _rename_in_policy(policy: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    """The podFailurePolicy with its onExitCodes rules on the training container renamed."""
    if not policy:
        return policy
    policy = copy.deepcopy(policy)
    for rule in policy.get("rules") or []:
        codes = rule.get("onExitCodes")
        if codes and codes.get("containerName") == CONTAINER:
            codes["containerName"] = name
    return policy


# --- TrainJob -----------------------------------------------------------------------------------------------------
def _trainjob(objects, parts, settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainingRuntime, TrainJob) from their skeletons and the Job."""
    runtime = _find(objects, "TrainingRuntime", RUNTIME)
    trainjob = _find(objects, "TrainJob", TRAIN_JOB)
    _require(runtime is not None and trainjob is not None,
             "workloads_train_kind trainjob: the layer lacks k8s/components/trainjob (TrainingRuntime "
             f"{RUNTIME}, TrainJob {TRAIN_JOB})")  # fmt: skip
    runtime = copy.deepcopy(runtime)
    runtime["metadata"] = _meta(runtime, parts)
    nodes = [r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"] if r["name"] == "node"]
    _require(len(nodes) == 1, f"TrainingRuntime {RUNTIME} must have one replicated Job 'node'")
    job_template = nodes[0]["template"]
    pod = _pod_for(parts, job_template["spec"]["template"], KIND_CONTAINERS["trainjob"])
    # resourcesPerNode is where the Trainer reads the GPUs per node from: one place for the node's size.
    resources = pod["spec"]["containers"][0].pop("resources", None) or {}
    job_template["spec"]["template"] = pod
    # Each node's Job fails, retries and ignores disruptions as the batch Job does; a failed node Job fails the
    # JobSet, and so the TrainJob (JobSet's default failurePolicy).
    if "backoffLimit" in parts["spec"]:
        job_template["spec"]["backoffLimit"] = parts["spec"]["backoffLimit"]
    if "podFailurePolicy" in parts["spec"]:
        job_template["spec"]["podFailurePolicy"] = _rename_in_policy(parts["spec"]["podFailurePolicy"], "node")
    trainjob = copy.deepcopy(trainjob)
    trainjob["metadata"] = _meta(trainjob, parts)
    trainer = trainjob["spec"].setdefault("trainer", {})
    trainer["numNodes"] = settings["nodes"]
    trainer["numProcPerNode"] = settings["processes"]
    if resources:
        trainer["resourcesPerNode"] = resources
    _stamp(trainjob, {"trainJob": trainjob["spec"], "runtime": runtime["spec"]})
    return runtime, trainjob


# --- PyTorchJob ---------------------------------------------------------------------------------------------------
def _pytorchjob(objects, parts, settings) -> dict[str, Any]:
    job = _find(objects, "PyTorchJob", TRAIN_JOB)
    _require(job is not None, f"workloads_train_kind pytorchjob: the layer lacks k8s/components/pytorchjob "
             f"(PyTorchJob {TRAIN_JOB})")  # fmt: skip
    job = copy.deepcopy(job)
    job["metadata"] = _meta(job, parts)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    master = replicas["Master"]
    master["template"] = _pod_for(parts, master["template"], KIND_CONTAINERS["pytorchjob"])
    # The replica's restartPolicy is the one that counts (kubeflow/trainer@v1.9.4 common_types.go ReplicaSpec).
    master["template"]["spec"].pop("restartPolicy", None)
    if settings["nodes"] > 1:
        replicas["Worker"] = {**copy.deepcopy(master), "replicas": settings["nodes"] - 1}
    job["spec"]["nprocPerNode"] = str(settings["processes"])
    if "backoffLimit" in parts["spec"]:
        job["spec"].setdefault("runPolicy", {})["backoffLimit"] = parts["spec"]["backoffLimit"]
    _stamp(job, job["spec"])
    return job


def _stamp(obj: dict[str, Any], content: Any) -> None:
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations[jobs.TEMPLATE_HASH_ANNOTATION] = jobs.content_hash(content)


# --- The search ---------------------------------------------------------------------------------------------------
def hpo_parameters(parameters: Any) -> list[dict[str, Any]]:
    """workloads_hpo_parameters checked: [{name, setting, override, type, min, max, step, list, distribution}] with
    name the Katib parameter's (the setting without DINO_ in lower case, or the override's name)."""
    where = "workloads_hpo_parameters"
    _require(isinstance(parameters, list) and parameters, f"{where} must be a non-empty list of parameters")
    checked, names = [], set()
    for index, raw in enumerate(parameters):
        at = f"{where}[{index}]"
        _require(isinstance(raw, dict), f"{at} must be a dict, got {raw!r}")
        unknown = sorted(set(raw) - {"setting", "override", "type", "min", "max", "step", "list", "distribution"})
        _require(not unknown, f"{at} has unknown keys {unknown}")
        setting = str(raw.get("setting") or "")
        _require(bool(SETTING.match(setting)), f"{at}.setting must be a DINO_* setting of dinops train, got "
                 f"{setting!r}")  # fmt: skip
        _require(setting not in FOLDED_SETTINGS, f"{at}.setting {setting} is set per trial by the role")
        override = str(raw.get("override") or "")
        _require(
            bool(override) == (setting == OVERRIDES_SETTING) and (not override or bool(OVERRIDE.match(override))),
            f"{at}: override names a DINOConfig field (e.g. dn_number) and goes with setting {OVERRIDES_SETTING} "
            f"only, got setting {setting!r}, override {override!r}",
        )
        kind = raw.get("type")
        _require(kind in PARAMETER_TYPES, f"{at}.type must be one of {', '.join(PARAMETER_TYPES)}, got {kind!r}")
        name = override or setting.removeprefix("DINO_").lower()
        _require(name not in names and name != TRIAL_NAME, f"{at}: {name} ({setting}) is searched twice")
        names.add(name)
        space: dict[str, Any] = {}
        if kind in ("double", "int"):
            _require("list" not in raw, f"{at}: a {kind} takes min and max, not list")
            number = float if kind == "double" else int
            try:
                low, high = number(raw["min"]), number(raw["max"])
            except (KeyError, TypeError, ValueError):
                raise TrainKindsError(f"{at} ({kind}) needs numbers min and max, got {raw!r}") from None
            _require(low < high, f"{at}: min must be below max, got {raw['min']} and {raw['max']}")
            distribution = raw.get("distribution") or "uniform"
            _require(distribution in DISTRIBUTIONS, f"{at}.distribution must be one of {', '.join(DISTRIBUTIONS)}")
            _require(distribution != "logUniform" or low > 0, f"{at}: logUniform needs min > 0")
            space = {"min": str(raw["min"]), "max": str(raw["max"]), "distribution": distribution}
            if raw.get("step") is not None:
                space["step"] = str(raw["step"])
        else:
            values = raw.get("list")
            _require(isinstance(values, list) and len(values) >= 2, f"{at}: a {kind} takes a list of 2 values or more")
            _require(not {"min", "max", "step", "distribution"} & set(raw), f"{at}: a {kind} takes list only")
            for value in values:
                text = str(value)
                if kind == "discrete":
                    try:
                        float(text)
                    except ValueError:
                        raise TrainKindsError(f"{at}: discrete values must be numbers, got {value!r}") from None
                # Katib substitutes the value into the trial's JSON text, and an override value into "a=b,c=d".
                _require(text and not set(text) & set('"\\') and not (override and "," in text),
                         f"{at}: value {value!r} cannot be substituted (no quotes or backslashes; no commas in an "
                         "override)")  # fmt: skip
            space = {"list": [str(v) for v in values]}
        checked.append({"name": name, "setting": setting, "override": override, "type": kind, "space": space})
    return checked


def _trial_env(parameters: list[dict[str, Any]], config: dict[str, str]) -> list[dict[str, str]]:
    """The environment of a trial's training container: each searched setting's value, the overrides appended to
    the ConfigMap's DINO_MODEL_OVERRIDES (explicit env wins over envFrom), and the trial's own output directory."""
    env: dict[str, str] = {}
    overrides = [p for p in parameters if p["override"]]
    for parameter in parameters:
        if not parameter["override"]:
            env[parameter["setting"]] = f"${{trialParameters.{parameter['name']}}}"
    if overrides:
        base = [config.get(OVERRIDES_SETTING, "")] if config.get(OVERRIDES_SETTING) else []
        env[OVERRIDES_SETTING] = ",".join(
            base + [f"{p['override']}=${{trialParameters.{p['name']}}}" for p in overrides]
        )
    output = config.get("DINO_OUTPUT_DIR")
    _require(bool(output), f"the ConfigMap of Job {TRAIN_JOB} gives no DINO_OUTPUT_DIR to put the trials under")
    env["DINO_OUTPUT_DIR"] = posixpath.join(output, "hpo", f"${{trialParameters.{TRIAL_NAME}}}")
    return [{"name": name, "value": value} for name, value in env.items()]


def _with_env(container: dict[str, Any], env: list[dict[str, str]]) -> None:
    names = {item["name"] for item in env}
    container["env"] = [e for e in container.get("env") or [] if e["name"] not in names] + env


def _one_process(resources: dict[str, Any], processes: int, shm_mi: int) -> dict[str, Any]:
    """The requests and limits of one training process of a pod sized for ``processes`` (sizing.py _size: per
    process, the memory limit plus the whole /dev/shm) and at most one GPU."""
    out: dict[str, Any] = {}
    for part in ("requests", "limits"):
        values = dict(resources.get(part) or {})
        if "cpu" in values:
            values["cpu"] = f"{max(quantities.cpu_m(values['cpu']) // processes, 1)}m"
        if "memory" in values:
            memory = quantities.quantity_mi(values["memory"])
            memory = (memory - shm_mi) // processes + shm_mi if part == "limits" else memory // processes
            values["memory"] = f"{max(memory, 1)}Mi"
        if GPU in values:
            values[GPU] = 1
        if values:
            out[part] = values
    return out


def _shm_mi(pod: dict[str, Any]) -> int:
    mounts = {m["name"] for m in pod["spec"]["containers"][0].get("volumeMounts") or [] if m["mountPath"] == "/dev/shm"}
    for volume in pod["spec"].get("volumes") or []:
        if volume["name"] in mounts and (volume.get("emptyDir") or {}).get("sizeLimit"):
            return quantities.quantity_mi(volume["emptyDir"]["sizeLimit"])
    return 0


def _trial_spec(kind, parts, trained, env, settings) -> dict[str, Any]:
    """The object one trial creates (Katib names it and puts it in the namespace: its metadata has neither)."""
    labels = {**parts["labels"], "app.kubernetes.io/name": EXPERIMENT}
    if kind == "trainjob":
        spec = copy.deepcopy(trained["spec"])
        _with_env(spec["trainer"], env)
        return {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": {"labels": labels}, "spec": spec}
    if kind == "pytorchjob":
        spec = copy.deepcopy(trained["spec"])
        for replica in spec["pytorchReplicaSpecs"].values():
            replica["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = EXPERIMENT
            _with_env(replica["template"]["spec"]["containers"][0], env)
        return {"apiVersion": PYTORCH_API, "kind": "PyTorchJob", "metadata": {"labels": labels}, "spec": spec}
    # The batch Job: one process on one GPU, so that as many trials run at once as there are GPUs.
    spec = copy.deepcopy(parts["spec"])
    pod = spec["template"]
    pod.setdefault("metadata", {}).setdefault("labels", {})["app.kubernetes.io/name"] = EXPERIMENT
    pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **NO_ISTIO}
    container = pod["spec"]["containers"][0]
    # Katib runs the command it finds on the container; without one it asks the registry for the image's entrypoint
    # (kubeflow/katib@v0.19.0:pkg/webhook/v1beta1/pod/utils.go getContainerCommand). The image's entrypoint is tini.
    container["command"] = ["tini", "--"]
    container["args"] = ["dinops", "train"]
    if container.get("resources"):
        container["resources"] = _one_process(container["resources"], settings["processes"], _shm_mi(pod))
    _with_env(container, env)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"labels": labels}, "spec": spec}


def _parallel(settings: dict[str, Any], hpo: dict[str, Any], kind: str, max_trials: int) -> int:
    """Trials at once: workloads_hpo_parallel_trials, or (0) the GPUs of the cluster's train nodes (this host's
    when the cluster's nodes are not known) over the GPUs of one trial; 1 on CPU."""
    wanted = _int(hpo.get("parallel_trials", 0), "workloads_hpo_parallel_trials", 0)
    if wanted:
        _require(wanted <= max_trials, f"workloads_hpo_parallel_trials ({wanted}) must not exceed "
                 f"workloads_hpo_max_trials ({max_trials}): Katib refuses it")  # fmt: skip
        return wanted
    per_node = int(settings.get("gpus") or 0)
    if not per_node:
        return 1
    train_nodes = [n for n in settings.get("cluster_nodes") or []
                   if (n.get("labels") or {}).get(kind_components.TRAIN_NODE_LABEL)]  # fmt: skip
    total = sum(int(n.get("gpu_count") or 0) for n in train_nodes) or per_node
    per_trial = 1 if kind == "job" else per_node * settings["nodes"]
    return max(1, min(total // per_trial, max_trials))


def _experiment(objects, parts, kind, trained, settings) -> dict[str, Any]:
    hpo = settings.get("hpo") or {}
    skeleton = _find(objects, "Experiment", EXPERIMENT)
    _require(skeleton is not None, f"workloads_hpo: the layer lacks k8s/components/katib-experiment "
             f"(Experiment {EXPERIMENT})")  # fmt: skip
    algorithm = hpo.get("algorithm")
    _require(algorithm in HPO_ALGORITHMS, f"workloads_hpo_algorithm must be one of {', '.join(HPO_ALGORITHMS)}, "
             f"got {algorithm!r}")  # fmt: skip
    max_trials = _int(hpo.get("max_trials"), "workloads_hpo_max_trials", 1)
    max_failed = _int(hpo.get("max_failed_trials"), "workloads_hpo_max_failed_trials", 0)
    _require(max_failed <= max_trials, f"workloads_hpo_max_failed_trials ({max_failed}) must not exceed "
             f"workloads_hpo_max_trials ({max_trials}): Katib refuses it")  # fmt: skip
    parameters = hpo_parameters(hpo.get("parameters"))
    config = _config_of(objects, parts["container"])
    env = _trial_env(parameters, config)
    experiment = copy.deepcopy(skeleton)
    experiment["metadata"] = _meta(experiment, parts, EXPERIMENT)
    spec = experiment["spec"]
    spec["algorithm"] = {"algorithmName": algorithm}
    spec["maxTrialCount"] = max_trials
    spec["parallelTrialCount"] = _parallel(settings, hpo, kind, max_trials)
    spec["maxFailedTrialCount"] = max_failed
    if not hpo.get("early_stopping", True):
        spec.pop("earlyStopping", None)
    spec["parameters"] = [
        {"name": p["name"], "parameterType": p["type"], "feasibleSpace": p["space"]} for p in parameters
    ]
    trial = TRIAL_KINDS[kind]
    template = {
        "primaryContainerName": KIND_CONTAINERS[kind],
        "successCondition": trial["success"],
        "failureCondition": trial["failure"],
        "trialParameters": [
            {"name": p["name"], "reference": p["name"], "description": f"{p['setting']} {p['override']}".strip()}
            for p in parameters
        ]
        + [{"name": TRIAL_NAME, "reference": "${trialSpec.Name}", "description": "the trial's output directory"}],
        "trialSpec": _trial_spec(kind, parts, trained, env, settings),
    }
    if trial["pods"]:
        template["primaryPodLabels"] = dict(trial["pods"])
    spec["trialTemplate"] = template
    # Only the trial counts may change on a running Experiment (TRIAL_COUNTS); a change elsewhere is a new search
    # (experiment_to_replace).
    _stamp(experiment, {key: value for key, value in spec.items() if key not in TRIAL_COUNTS})
    return experiment


def _config_of(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The settings the container takes from the layer's ConfigMaps (envFrom), then its explicit env."""
    config: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        name = (source.get("configMapRef") or {}).get("name")
        if name:
            found = _find(objects, "ConfigMap", name)
            _require(found is not None, f"Job {TRAIN_JOB} reads ConfigMap {name}, which is not in the layer")
            config.update({str(k): str(v) for k, v in (found.get("data") or {}).items()})
    config.update({e["name"]: str(e.get("value", "")) for e in container.get("env") or [] if "value" in e})
    return config


def _namespace(objects: list[dict[str, Any]], parts: dict[str, Any], hpo: bool, workers: bool) -> None:
    """Katib's injection label when searching; Pod Security baseline where an operator creates a pod or a container
    without a securityContext: Katib's suggestion pod, PyTorchJob workers' init-pytorch (see PSA above)."""
    namespace = _find(objects, "Namespace", parts["namespace"] or "")
    if namespace is None or not (hpo or workers):
        return
    labels = namespace["metadata"].setdefault("labels", {})
    if hpo:
        labels.update(KATIB_NAMESPACE_LABEL)
    if labels.get(PSA + "enforce") == "restricted":
        labels[PSA + "enforce"] = "baseline"
        for mode in ("warn", "audit"):
            labels[PSA + mode] = "restricted"
            labels[PSA + mode + "-version"] = labels.get(PSA + "enforce-version", "latest")


def train_kinds(objects: list[dict[str, Any]], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The rendered (and prepared: dinops_prepare_objects) objects with training in the kind asked for.

    ``settings``: kind (workloads_train_kind: job, trainjob, pytorchjob), nodes (workloads_train_nodes), processes
    and gpus (the plan's train_processes and train_gpus: per node), cluster_nodes (workloads_cluster_nodes), hpo
    ({enabled, algorithm, max_trials, parallel_trials (0: from the GPUs), max_failed_trials, early_stopping,
    parameters}: workloads_hpo*), restricted_operators (the platform stage installed the operators, with their
    restricted containers: no Pod Security downgrade for PyTorchJob workers). Without the Job (this host does not
    train) the objects come back as they are.
    """
    kind = str(settings.get("kind") or "job")
    _require(kind in KIND_CONTAINERS, f"workloads_train_kind must be one of job, trainjob, pytorchjob, got {kind!r}")
    hpo = bool((settings.get("hpo") or {}).get("enabled"))
    objects = rendered.plain([o for o in objects if o])
    job = _find(objects, "Job", TRAIN_JOB)
    skeletons = [
        o
        for o in objects
        if (o.get("kind"), o["metadata"]["name"])
        in (
            ("TrainingRuntime", RUNTIME),
            ("TrainJob", TRAIN_JOB),
            ("PyTorchJob", TRAIN_JOB),
            ("Experiment", EXPERIMENT),
        )
    ]
    if job is None:
        _require(not skeletons, f"the layer has {[o['kind'] for o in skeletons]} but no Job {TRAIN_JOB} to fold")
        return objects
    parts = _job_parts(job)
    settings = {**settings, "kind": kind, "nodes": _int(settings.get("nodes", 1), "workloads_train_nodes", 1),
                "processes": _int(settings.get("processes") or 1, "train processes", 1)}  # fmt: skip
    folded: list[dict[str, Any]] = []
    trained = None
    if kind == "trainjob":
        runtime, trained = _trainjob(objects, parts, settings)
        folded = [runtime] if hpo else [runtime, trained]
    elif kind == "pytorchjob":
        trained = _pytorchjob(objects, parts, settings)
        folded = [] if hpo else [trained]
    elif not hpo:
        folded = [job]
    if hpo:
        folded.append(_experiment(objects, parts, kind, trained, settings))
    else:
        _require(_find(objects, "Experiment", EXPERIMENT) is None, "the layer has the Katib Experiment but "
                 "workloads_hpo is false")  # fmt: skip
    workers = kind == "pytorchjob" and settings["nodes"] > 1 and not settings.get("restricted_operators")
    _namespace(objects, parts, hpo, workers)
    left_out = {id(o) for o in skeletons}
    out = []
    for obj in objects:
        if obj is job:
            out.extend(folded)
        elif id(obj) not in left_out:
            out.append(obj)
    return out


def kubeflow_crds(objects: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The CRDs of the Kubeflow kinds and KServe's InferenceService: [{crd, api_version, kind, live (the role reads
    the live objects of the kind), needed (``objects`` hold one), message (what to set when it is needed and not
    served)}]."""
    kinds = {(o.get("apiVersion"), o.get("kind")) for o in objects or [] if o}
    return [
        {"crd": crd, "api_version": api, "kind": kind, "live": live, "needed": (api, kind) in kinds,
         "message": f"{setting} needs {what}: the cluster does not serve {crd} ({kind})"}
        for crd, api, kind, live, setting, what in KUBEFLOW_CRDS
    ]  # fmt: skip


# What Katib lets change on a live Experiment, and only while it runs (kubeflow/katib@v0.19.0:pkg/webhook/v1beta1/
# experiment/validator/validator.go): once it has Succeeded or Failed, any spec change is refused unless it is
# restartable (Succeeded by max trials with resumePolicy LongRunning or FromVolume, pkg/controller.v1beta1/
# experiment/util/status_util.go IsCompletedExperimentRestartable); dinops leaves resumePolicy at Never.
TRIAL_COUNTS = ("maxTrialCount", "parallelTrialCount", "maxFailedTrialCount")
SEARCH_CHANGED = "its search changed"
COUNTS_CHANGED = "its trial counts changed and Katib refuses any change to a finished Experiment"


def _experiment_change(desired: dict[str, Any], experiment: dict[str, Any]) -> str:
    """Why the live ``experiment`` is deleted before ``desired`` is applied ("" to keep it): another search (by the
    stamped hash), or other trial counts once it has finished. Raises what Katib's webhook would refuse of a running
    one, with what to do."""
    metadata = experiment.get("metadata") or {}
    name, namespace = metadata.get("name"), metadata.get("namespace", "dinops")
    searched = (metadata.get("annotations") or {}).get(jobs.TEMPLATE_HASH_ANNOTATION)
    search_changed = searched != desired["metadata"]["annotations"][jobs.TEMPLATE_HASH_ANNOTATION]
    live_spec, spec = experiment.get("spec") or {}, desired.get("spec") or {}
    counts_changed = any(live_spec.get(key) != spec.get(key) for key in TRIAL_COUNTS)
    if not (search_changed or counts_changed):
        return ""
    status = experiment.get("status") or {}
    finished = any(
        c.get("status") == "True" and c.get("type") in ("Succeeded", "Failed") for c in status.get("conditions") or []
    )
    if finished:
        return SEARCH_CHANGED if search_changed else COUNTS_CHANGED
    delete = f"kubectl -n {namespace} delete experiment {name}; its trials' checkpoints stay in the output volume"
    _require(
        not search_changed,
        f"Experiment {name} is still searching with other settings (workloads_hpo_* or the training it tries "
        f"changed) and Katib lets only its trial counts change: wait for it, or delete it to start the new "
        f"search ({delete})",
    )
    made = int(status.get("trials") or 0)
    _require(
        int(spec.get("maxTrialCount") or 0) > made,
        f"workloads_hpo_max_trials {spec.get('maxTrialCount')} is not above the {made} trials Experiment {name} "
        f"already made, which Katib refuses while it runs: set workloads_hpo_max_trials above {made}, or wait for "
        f"it to finish (it is then replaced), or delete it ({delete})",
    )
    return ""


def experiment_to_replace(desired: list[dict[str, Any]], live: list[dict[str, Any]]) -> list[str]:
    """Names of live Experiments that are deleted so that the desired one can be applied: a finished (Succeeded or
    Failed) one whose search or trial counts differ. A running one with another search is an error: deleting it
    would stop its trials, so the role says what to do instead; a running one takes new counts in place."""
    wanted = {o["metadata"]["name"]: o for o in desired if o.get("kind") == "Experiment"}
    names = []
    for experiment in live or []:
        name = (experiment.get("metadata") or {}).get("name")
        if name in wanted and _experiment_change(wanted[name], experiment):
            names.append(name)
    return sorted(names)


# What one training run is, whichever kind: a second one of another kind would train beside it into the same output.
TRAINING = (("Job", TRAIN_JOB), ("TrainJob", TRAIN_JOB), ("PyTorchJob", TRAIN_JOB), ("Experiment", EXPERIMENT))


def objects_to_delete(desired: list[dict[str, Any]], live: list[dict[str, Any]]) -> list[dict[str, str]]:
    """[{apiVersion, kind, name, why}] of the live objects apply.yml deletes before applying ``desired``: a Job,
    TrainJob or PyTorchJob whose stamped template changed (dinops_jobs_to_replace) or that failed in an earlier run
    (dinops_failed_jobs), an Experiment whose search changed and that has finished (experiment_to_replace), and,
    when ``desired`` trains, the training of another kind (workloads_train_kind or workloads_hpo changed). Live
    objects without a kind are Jobs (k8s_info of kind Job)."""
    wanted = {(o.get("kind"), (o.get("metadata") or {}).get("name")) for o in desired or [] if o}
    trains = any(key in wanted for key in TRAINING)
    out: list[dict[str, str]] = []
    for obj in live or []:
        obj = {"kind": "Job", "apiVersion": "batch/v1", **obj}
        key = (obj["kind"], obj["metadata"]["name"])
        if key in wanted and obj["kind"] == "Experiment":
            experiment = next(o for o in desired if o.get("kind") == "Experiment" and o["metadata"]["name"] == key[1])
            why = _experiment_change(experiment, obj)
        elif key in wanted:
            why = (
                "its template changed"
                if jobs.jobs_to_replace(desired, [obj])
                else ("it failed before" if rollout.failed_jobs(desired, [obj]) else "")
            )
        else:
            why = "training runs as another kind now" if trains and key in TRAINING else ""
        if why:
            out.append({"apiVersion": obj["apiVersion"], "kind": key[0], "name": key[1], "why": why})
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_train_kinds": train_kinds,
            "dinops_kubeflow_crds": kubeflow_crds,
            "dinops_objects_to_delete": objects_to_delete,
        }
