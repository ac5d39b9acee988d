"""Decisions of the workloads role's waits, kept out of YAML so that pytest can feed them real API objects.

``dinops_rollout_state``     where a Deployment's rollout stands (kubernetes.core's ``deployment_ready`` semantics)
                             and, from its pods, the reasons that waiting will not heal.
``dinops_job_progress``      where a Job stands, from the Job and its pods: complete, failed (Kubernetes' reason),
                             blocked (a pod that waiting will not heal), started (past the init containers), waiting.
``dinops_failed_jobs``       live Jobs (TrainJobs, PyTorchJobs) that failed in an earlier run and are applied
                             again: deleted so they rerun.
``dinops_train_outcome``     where a TrainJob or a PyTorchJob stands, from its status conditions.
``dinops_experiment_state``  where Katib's Experiment stands: created, running, succeeded, failed, with its trials.
``dinops_serve_state``       the inference pod's ``GET /healthz`` answer: serving, waiting, loading or failed,
                             with a line that says what to do (unknown while the proxy call fails).
``dinops_service_proxy_path`` the API server's proxy path of a Service port, for ``kubectl get --raw``.

Every function takes what ``kubectl get <kinds> -o json`` prints (a ``List``, as text or parsed), the registered
result of that command (a failed call gives state ``unknown`` with kubectl's error, so an ``until`` retries it
instead of aborting), a list of objects, or single objects. Fields read, as the Kubernetes v1.33 API reference
defines them:

- DeploymentStatus: observedGeneration, replicas, updatedReplicas, availableReplicas, unavailableReplicas,
  conditions (Progressing/False/ProgressDeadlineExceeded)
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/deployment-v1/#DeploymentStatus
- JobStatus.conditions (Failed, FailureTarget, Complete)
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/#JobStatus
- TrainJob status.conditions (Complete, Failed, Suspended), copied from its JobSet's Completed and Failed with
  their reason and message (kubeflow/trainer@v2.3.0:pkg/apis/trainer/v1alpha1/trainjob_types.go,
  pkg/runtime/framework/plugins/jobset/jobset.go); its pods carry jobset.sigs.k8s.io/jobset-name=<TrainJob> (the
  JobSet is named after the TrainJob; kubernetes-sigs/jobset@v0.12.0:api/jobset/v1alpha2/jobset_types.go
  JobSetNameKey).
- PyTorchJob status.conditions (Created, Running, Restarting, Succeeded, Failed); its pods carry
  training.kubeflow.org/job-name=<PyTorchJob> (kubeflow/trainer@v1.9.4:pkg/apis/kubeflow.org/v1/common_types.go
  JobConditionType, JobNameLabel).
- Experiment status.conditions (Created, Running, Restarting, Succeeded, Failed), trial counts and
  currentOptimalTrial (kubeflow/katib@v0.19.0:pkg/apis/controller/experiments/v1beta1/experiment_types.go).
- PodStatus.conditions PodScheduled/False/Unschedulable (reason constant ``Unschedulable``, message from the
  scheduler, e.g. "0/1 nodes are available: 1 Insufficient cpu.")
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus
- ContainerStatus.state.waiting.reason (ErrImagePull, ImagePullBackOff, InvalidImageName, ErrImageNeverPull,
  CrashLoopBackOff) and lastState.terminated (exitCode, reason, message)
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#ContainerStatus
  https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-state-waiting
"""

from __future__ import annotations

import functools
import importlib.util
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# Reasons a container waits in that do not heal by waiting (the image is not on the node; the process keeps dying).
IMAGE_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CRASH_REASON = "CrashLoopBackOff"
# A pod the scheduler cannot place for this long is reported: shorter gaps happen while another workload's pod still
# terminates and releases its GPU or CPU (the serve pod's grace period is the default 30 s).
UNSCHEDULABLE_GRACE_S = 60
MODEL_STATES = {"ready": "serving", "waiting": "waiting", "loading": "loading", "failed": "failed"}
IMAGES_HINT = (
    "the image is not in the cluster's runtime: images_load must match the cluster (minikube: the node's own "
    "Docker, k3s: containerd), then run the images stage again"
)


class RolloutError(ValueError):
    """Input that is not what the API or the role gives; the message names it."""


class KubectlFailed(RolloutError):
    """The registered kubectl call failed: the wait retries, the report names the error."""


def _command_error(value: Any) -> str | None:
    """For a registered command result ({rc, stdout, stderr}): kubectl's error when it failed, else None."""
    if isinstance(value, dict) and "rc" in value and "stdout" in value and value.get("rc") != 0:
        said = (value.get("stderr") or value.get("msg") or "no error output").strip()
        return f"kubectl failed (exit {value.get('rc')}): {said}"
    return None


def _objects(value: Any) -> list[dict[str, Any]]:
    """API objects from kubectl's JSON text, a List, a list, one object, or a registered command result (None and
    '' give none); a failed command raises KubectlFailed."""
    if value is None or value == "":
        return []
    if isinstance(value, dict) and "rc" in value and "stdout" in value:
        error = _command_error(value)
        if error:
            raise KubectlFailed(error)
        value = value["stdout"]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RolloutError(f"kubectl printed no JSON: {value[:200]!r}") from exc
    if isinstance(value, dict):
        return list(value.get("items") or []) if "items" in value or value.get("kind", "").endswith("List") else [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, dict)]
    raise RolloutError(f"expected Kubernetes objects, got {type(value).__name__}")


def _of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj.get("kind", kind) == kind]


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "?")


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def _now(now: Any) -> datetime:
    if now is None or now == "":
        return datetime.now(timezone.utc)
    if isinstance(now, datetime):
        return now if now.tzinfo else now.replace(tzinfo=timezone.utc)
    return _parse_time(str(now)) or datetime.now(timezone.utc)


def pod_blockers(pods: Any, now: Any = None, grace_s: int = UNSCHEDULABLE_GRACE_S) -> list[str]:
    """Why each pod cannot get further by waiting, one sentence each (empty when nothing blocks)."""
    blockers = []
    for pod in _of_kind(_objects(pods), "Pod"):
        metadata = pod.get("metadata") or {}
        if metadata.get("deletionTimestamp"):
            continue  # leaving: its replacement is the one that counts
        status = pod.get("status") or {}
        name = _name(pod)
        for condition in status.get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                since = _parse_time(condition.get("lastTransitionTime"))
                if since is None or (_now(now) - since).total_seconds() >= grace_s:
                    message = (condition.get("message") or "no message").strip()
                    blockers.append(f"pod {name} cannot be scheduled: {message}")
        containers = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
        for container in containers:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in IMAGE_REASONS:
                image = container.get("image") or "?"
                blockers.append(
                    f"pod {name} container {container.get('name', '?')} cannot get image {image} ({reason}: "
                    f"{(waiting.get('message') or 'no message').strip()}); {IMAGES_HINT}"
                )
            elif reason == CRASH_REASON:
                last = (container.get("lastState") or {}).get("terminated") or {}
                said = (last.get("message") or "").strip() or "no termination message"
                blockers.append(
                    f"pod {name} container {container.get('name', '?')} keeps crashing ({reason}, "
                    f"{container.get('restartCount', 0)} restarts, last exit {last.get('exitCode', '?')} "
                    f"{last.get('reason', '')}): {said}".replace(" )", ")")
                )
    return blockers


def deployment_ready(deployment: dict[str, Any]) -> bool:
    """kubernetes.core 6.2.0 ``deployment_ready`` (plugins/module_utils/k8s/waiter.py) plus the rollout's own
    completion rule (kubectl rollout status): every replica updated, none old, observedGeneration caught up."""
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    generation = (deployment.get("metadata") or {}).get("generation", 0)
    wanted = spec.get("replicas", 1)
    replicas = status.get("replicas") or 0
    return bool(
        status
        and status.get("observedGeneration", -1) >= generation
        and wanted == replicas
        and (status.get("updatedReplicas") or 0) == wanted
        and (status.get("availableReplicas") or 0) == wanted
        and not status.get("unavailableReplicas")
    )


def rollout_state(deployment: Any, pods: Any = None, now: Any = None, grace_s: int = UNSCHEDULABLE_GRACE_S) -> dict:
    """{state: ready | progressing | failed | missing, message} of one Deployment.

    ``deployment``: the Deployment, or kubectl's List of the Deployment and its pods (then ``pods`` may be left out).
    failed: a pod waits for a reason that waiting will not heal, or the controller gave up (ProgressDeadlineExceeded).
    """
    try:
        objects = _objects(deployment)
    except KubectlFailed as exc:
        return {"state": "unknown", "message": str(exc)}
    deployments = _of_kind(objects, "Deployment")
    pod_list = [obj for obj in objects if obj.get("kind") == "Pod"] if pods is None else _of_kind(_objects(pods), "Pod")
    if not deployments:
        return {"state": "missing", "message": "the Deployment does not exist"}
    found = deployments[0]
    name = _name(found)
    if deployment_ready(found):
        return {
            "state": "ready",
            "message": f"Deployment {name} rolled out ({found['status']['availableReplicas']} available)",
        }
    blockers = pod_blockers(pod_list, now=now, grace_s=grace_s)
    if blockers:
        return {"state": "failed", "message": f"Deployment {name} cannot roll out: " + "; ".join(blockers)}
    status = found.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return {"state": "failed", "message": f"Deployment {name}: {condition.get('message', 'no message')}"}
    wanted = (found.get("spec") or {}).get("replicas", 1)
    return {
        "state": "progressing",
        "message": (
            f"Deployment {name}: {status.get('updatedReplicas', 0)} of {wanted} updated, "
            f"{status.get('availableReplicas', 0)} available, {status.get('replicas', 0)} in all, generation "
            f"{status.get('observedGeneration', 0)} of {(found.get('metadata') or {}).get('generation', 0)} observed"
        ),
    }


@functools.cache
def _jobs_filters() -> Any:
    spec = importlib.util.spec_from_file_location("dinops_jobs_for_rollout", Path(__file__).with_name("jobs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _job_outcome(resources: list[dict[str, Any]]) -> dict[str, str]:
    """jobs.py's ``dinops_job_outcome`` (one reading of JobStatus for the whole role), loaded from its file."""
    return _jobs_filters().job_outcome(resources)


# The training kinds other than the Job: the condition that completes them and the label their pods carry.
TRAIN_KINDS = {
    "TrainJob": {"complete": "Complete", "pod_label": "jobset.sigs.k8s.io/jobset-name"},
    "PyTorchJob": {"complete": "Succeeded", "pod_label": "training.kubeflow.org/job-name"},
}


def train_outcome(resources: list[dict[str, Any]]) -> dict[str, str]:
    """Where a TrainJob or a PyTorchJob stands (``resources``: what k8s_info returned, empty when it does not
    exist): ``state`` complete, failed, running or missing, ``message`` with the operator's reason."""
    if not resources:
        return {"state": "missing", "message": "the training object does not exist"}
    obj = resources[0]
    kind = obj.get("kind", "?")
    if kind not in TRAIN_KINDS:
        raise RolloutError(f"train_outcome reads TrainJob and PyTorchJob, got {kind}")
    metadata = obj.get("metadata") or {}
    name, namespace = metadata.get("name", "?"), metadata.get("namespace", "dinops")
    conditions = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    by_type = {c.get("type"): c for c in conditions}
    if "Failed" in by_type:
        failed = by_type["Failed"]
        return {
            "state": "failed",
            "message": f"{kind} {name} failed ({failed.get('reason') or 'Failed'}): "
            f"{failed.get('message') or 'no message'}. Its pods: kubectl -n {namespace} get pods "
            f"-l {TRAIN_KINDS[kind]['pod_label']}={name}",
        }
    if TRAIN_KINDS[kind]["complete"] in by_type:
        return {"state": "complete", "message": f"{kind} {name} completed"}
    latest = conditions[-1].get("type") if conditions else "no condition yet"
    return {"state": "running", "message": f"{kind} {name} is running ({latest})"}


def _outcome(obj: dict[str, Any]) -> dict[str, str]:
    return train_outcome([obj]) if obj.get("kind") in TRAIN_KINDS else _job_outcome([obj])


def _started(pod: dict[str, Any]) -> bool:
    """Past its init containers: every init container terminated with 0 and a main container runs or ran."""
    status = pod.get("status") or {}
    inits = status.get("initContainerStatuses") or []
    if any(((c.get("state") or {}).get("terminated") or {}).get("exitCode") != 0 for c in inits):
        return False
    return any(
        "running" in (c.get("state") or {}) or "terminated" in (c.get("state") or {})
        for c in status.get("containerStatuses") or []
    )


def _pod_summary(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = container.get("state") or {}
        if "waiting" in state or "running" in state:
            which = "waiting" if "waiting" in state else "running"
            reason = (state.get("waiting") or {}).get("reason", "")
            phase = status.get("phase", "?")
            return f"pod {_name(pod)} {phase}, container {container.get('name')} {which} {reason}".strip()
    return f"pod {_name(pod)} {status.get('phase', '?')}"


def job_progress(objects: Any, now: Any = None, grace_s: int = UNSCHEDULABLE_GRACE_S) -> dict[str, str]:
    """{state: complete | failed | blocked | started | waiting | missing, message} of one Job (or TrainJob, or
    PyTorchJob), from kubectl's List of it and its pods. failed and complete come from its conditions; blocked from
    a pod that waiting will not heal; started once a pod is past its init containers (training: the dataset is
    there). A TrainJob's or PyTorchJob's pods are those its operator labelled with its name."""
    try:
        items = _objects(objects)
    except KubectlFailed as exc:
        return {"state": "unknown", "message": str(exc)}
    trained = [obj for obj in items if obj.get("kind") in TRAIN_KINDS]
    jobs = trained[:1] or _of_kind(items, "Job")
    outcome = train_outcome(jobs) if trained else _job_outcome(jobs)
    if outcome["state"] in ("complete", "failed", "missing"):
        return outcome
    pods = [obj for obj in items if obj.get("kind") == "Pod"]
    kind, name = jobs[0].get("kind", "Job"), _name(jobs[0])
    if trained:
        label = TRAIN_KINDS[kind]["pod_label"]
        pods = [pod for pod in pods if ((pod.get("metadata") or {}).get("labels") or {}).get(label) == name]
    blockers = pod_blockers(pods, now=now, grace_s=grace_s)
    if blockers:
        return {"state": "blocked", "message": f"{kind} {name} cannot run: " + "; ".join(blockers)}
    live = [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]
    if any(_started(pod) for pod in live):
        return {
            "state": "started",
            "message": f"{kind} {name} is running ({_pod_summary(next(p for p in live if _started(p)))})",
        }
    seen = ", ".join(_pod_summary(pod) for pod in live) or "no pod yet"
    return {"state": "waiting", "message": f"{kind} {name} has not started yet: {seen}"}


def failed_jobs(desired: list[dict[str, Any]], live_jobs: Any) -> list[str]:
    """Names of live Jobs (TrainJobs, PyTorchJobs) that failed and are applied again: kept, a failed one would never
    run again (its template hash is unchanged, so dinops_jobs_to_replace keeps it). Live objects without a kind
    are Jobs (what k8s_info of kind Job returns)."""
    wanted = {(obj.get("kind"), _name(obj)) for obj in desired or [] if obj.get("kind") in ("Job", *TRAIN_KINDS)}
    names = []
    for job in _objects(live_jobs):
        job = {"kind": "Job", **job}
        if (job["kind"], _name(job)) in wanted and _outcome(job)["state"] == "failed":
            names.append(_name(job))
    return sorted(names)


def experiment_state(experiment: Any) -> dict[str, str]:
    """{state: created | running | succeeded | failed | missing | unknown, message} of Katib's Experiment, from
    what ``kubectl get experiment -o json`` printed (or the registered command): its latest condition, the trial
    counts and the best trial so far."""
    error = _command_error(experiment)
    if error:
        if "NotFound" in error or "not found" in error:
            return {"state": "missing", "message": "the Experiment does not exist"}
        return {"state": "unknown", "message": error}
    found = _objects(experiment)
    if not found:
        return {"state": "missing", "message": "the Experiment does not exist"}
    obj = found[0]
    name, status = _name(obj), obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    state = next((s for s in ("Failed", "Succeeded", "Running", "Restarting", "Created") if s in conditions), None)
    counts = (
        f"{status.get('trials', 0)} trial(s): {status.get('trialsSucceeded', 0)} succeeded, "
        f"{status.get('trialsRunning', 0)} running, {status.get('trialsFailed', 0)} failed, "
        f"{status.get('trialsEarlyStopped', 0)} stopped early"
    )
    best = status.get("currentOptimalTrial") or {}
    if best.get("bestTrialName"):
        metrics = (best.get("observation") or {}).get("metrics") or []
        values = ", ".join(f"{m.get('name')}={m.get('latest')}" for m in metrics)
        assignments = ", ".join(f"{a.get('name')}={a.get('value')}" for a in best.get("parameterAssignments") or [])
        counts += f"; best {best['bestTrialName']} ({values}) with {assignments}"
    if state is None:
        return {"state": "created", "message": f"Experiment {name} was accepted, Katib has not started it yet"}
    condition = conditions[state]
    why = f"{condition.get('reason') or state}: {condition.get('message') or 'no message'}"
    mapped = {"Failed": "failed", "Succeeded": "succeeded", "Created": "created"}.get(state, "running")
    return {"state": mapped, "message": f"Experiment {name} {state.lower()} ({why}); {counts}"}


def serve_state(
    healthz: Any, train: bool = False, checkpoint_path: str = "", namespace: str = "dinops"
) -> dict[str, str]:
    """{state: serving | waiting | loading | failed, message, checkpoint} from the inference pod's GET /healthz.

    ``healthz``: its JSON body (text or parsed): {"model": "waiting|loading|ready|failed", "checkpoint": path,
    "error": ...}. ``train``: the training Job was applied (so a checkpoint will come). ``checkpoint_path``: the
    configured path, used when the answer names none. ``namespace``: where to read the log when the answer gives no
    error (apps/src/dinops/serve/health.py answers {"status", "model", "checkpoint"}; /readyz carries the error).
    """
    error = _command_error(healthz)
    if error:
        return {
            "state": "unknown",
            "message": f"inference's /healthz did not answer: {error}",
            "checkpoint": checkpoint_path,
        }
    if isinstance(healthz, dict) and "rc" in healthz and "stdout" in healthz:
        healthz = healthz["stdout"]
    if isinstance(healthz, str):
        try:
            healthz = json.loads(healthz)
        except ValueError:
            return {
                "state": "failed",
                "message": f"inference's /healthz answered no JSON: {healthz.strip()[:200]!r}",
                "checkpoint": checkpoint_path,
            }
    if not isinstance(healthz, dict) or healthz.get("model") not in MODEL_STATES:
        return {
            "state": "failed",
            "message": f"inference's /healthz gives no model state (waiting, loading, ready, failed): {healthz!r}",
            "checkpoint": checkpoint_path,
        }
    state = MODEL_STATES[healthz["model"]]
    path = str(healthz.get("checkpoint") or checkpoint_path or "the configured checkpoint path")
    if state == "serving":
        message = f"inference is serving the model from {path}"
    elif state == "loading":
        message = f"inference is loading the model from {path}"
    elif state == "failed":
        why = healthz.get("error") or f"its log says why: kubectl -n {namespace} logs deploy/dinops-serve"
        message = f"inference could not load the model from {path}: {why}"
    elif train:
        message = (
            f"inference is waiting for a model at {path}: training is running and its first checkpoint will be loaded"
        )
    else:
        message = (
            f"inference is waiting for a model at {path}: set dinops_train: true on a host whose profile lists "
            f"train, or workloads_checkpoint_url + workloads_checkpoint_sha256, or copy a checkpoint to {path} in "
            "the output volume"
        )
    return {"state": state, "message": message, "checkpoint": path}


def service_proxy_path(namespace: str, service: str, port: str, path: str = "") -> str:
    """/api/v1/namespaces/<ns>/services/<service>:<port name>/proxy/<path>, the API server's proxy to a Service
    (https://kubernetes.io/docs/tasks/access-application-cluster/access-cluster-services/#manually-constructing-apiserver-proxy-urls)."""
    for label, value in (("workloads_namespace", namespace), ("service", service), ("port", port)):
        if not value or "/" in str(value) or ":" in str(value):
            raise RolloutError(f"{label} must be a plain name for the service proxy path, got {value!r}")
    return f"/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy/{str(path).lstrip('/')}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_rollout_state": rollout_state,
            "dinops_job_progress": job_progress,
            "dinops_failed_jobs": failed_jobs,
            "dinops_train_outcome": train_outcome,
            "dinops_experiment_state": experiment_state,
            "dinops_pod_blockers": pod_blockers,
            "dinops_serve_state": serve_state,
            "dinops_service_proxy_path": service_proxy_path,
        }
