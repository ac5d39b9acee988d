"""What the cluster says, read for the role's decisions and messages (fed with kubectl's JSON, so that pytest can
feed real API objects).

``dinops_platform_wait_report``  whether the operators of a namespace are available and, when not, one line per
                                 Deployment, StatefulSet or DaemonSet that is not, with its pods' reasons.
``dinops_platform_crd_problems`` the CRDs dinops needs that the cluster does not serve at the expected version.
``dinops_platform_version_problems`` the components the cluster's Kubernetes is too old for.
``dinops_platform_diff_objects`` the objects ``kubectl diff`` found different (from ``diff -q`` lines).

Fields read, as the Kubernetes v1.33 API reference defines them:

- DeploymentStatus (observedGeneration, replicas, updatedReplicas, availableReplicas, conditions ReplicaFailure)
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/deployment-v1/#DeploymentStatus
- StatefulSetStatus (observedGeneration, readyReplicas, availableReplicas, updatedReplicas)
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/stateful-set-v1/#StatefulSetStatus
- DaemonSetStatus (desiredNumberScheduled, updatedNumberScheduled, numberAvailable)
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/daemon-set-v1/#DaemonSetStatus
- PodStatus.conditions PodScheduled/False/Unschedulable with the scheduler's message, ContainerStatus.state.waiting
  {reason, message} (ErrImagePull, ImagePullBackOff, CrashLoopBackOff, CreateContainerConfigError, ...)
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus
- PersistentVolumeClaimStatus.phase (Pending until a volume is bound)
  https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/persistent-volume-claim-v1/
- CustomResourceDefinition spec.versions[].served and status.conditions Established
  https://kubernetes.io/docs/reference/kubernetes-api/extend-resources/custom-resource-definition-v1/
"""

from __future__ import annotations

import json
import re
from pathlib import PurePath
from typing import Any

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
# kubectl diff writes each object to <dir>/<group.>version.Kind.namespace.name (kubernetes/kubectl@v0.33.13:
# pkg/cmd/diff/diff.go InfoObject.Name) and runs KUBECTL_EXTERNAL_DIFF on the two directories; `diff -q` says
# "Files <live> and <merged> differ" per object (GNU diffutils).
DIFF_LINE = re.compile(r"^Files (\S+) and (\S+) differ$")
DIFF_NAME = re.compile(r"^(?:(?P<group>.+?)\.)?(?P<version>v\d+(?:(?:alpha|beta)\d+)?)\.(?P<kind>[A-Z]\w*)\."
                       r"(?P<namespace>[a-z0-9-]*)\.(?P<name>.+)$")  # fmt: skip


class ClusterError(ValueError):
    """kubectl printed something the role cannot read; the message says what."""


def _items(value: Any) -> list[dict[str, Any]]:
    """API objects from kubectl's JSON (text, a List, a registered command result); a failed call raises."""
    if isinstance(value, dict) and "rc" in value and "stdout" in value:
        if value.get("rc") != 0:
            said = (value.get("stderr") or value.get("msg") or "no error output").strip()
            raise ClusterError(f"kubectl failed (exit {value.get('rc')}): {said}")
        value = value["stdout"]
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as error:
            raise ClusterError(f"kubectl printed no JSON: {value[:200]!r}") from error
    if isinstance(value, dict):
        return [i for i in value.get("items") or [] if isinstance(i, dict)] if "items" in value else [value]
    if isinstance(value, list):
        return [i for i in value if isinstance(i, dict)]
    raise ClusterError(f"expected Kubernetes objects, got {type(value).__name__}")


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", "?"))


def workload_available(obj: dict[str, Any]) -> bool:
    """A Deployment, StatefulSet or DaemonSet whose controller caught up and whose every replica is available."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation", 0)
    if status.get("observedGeneration", -1) < generation:
        return False
    if obj.get("kind") == "DaemonSet":
        desired = status.get("desiredNumberScheduled", 0)
        return status.get("updatedNumberScheduled", 0) == desired and status.get("numberAvailable", 0) == desired
    wanted = (obj.get("spec") or {}).get("replicas", 1)
    available = status.get("availableReplicas", status.get("readyReplicas", 0) if obj["kind"] == "StatefulSet" else 0)
    return (status.get("updatedReplicas") or 0) == wanted and (available or 0) == wanted


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """LabelSelector matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist) against pod labels."""
    if not selector:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if (
            (operator == "In" and labels.get(key) not in values)
            or (operator == "NotIn" and present and labels.get(key) in values)
            or (operator == "Exists" and not present)
            or (operator == "DoesNotExist" and present)
        ):
            return False
    return True


def _claims(pod: dict[str, Any]) -> list[str]:
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return [v["persistentVolumeClaim"]["claimName"] for v in volumes if (v.get("persistentVolumeClaim") or {})]


def pod_reasons(pod: dict[str, Any], claims: dict[str, dict[str, Any]]) -> list[str]:
    """Why one pod is not running and ready: the scheduler's message, each waiting container's reason (an image
    that cannot be pulled is named), an unbound claim, or a container that runs but is not ready."""
    status = pod.get("status") or {}
    name = _name(pod)
    reasons = []
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            said = (condition.get("message") or condition.get("reason") or "no message").strip()
            reasons.append(f"pod {name} Pending, not scheduled: {said}")
    for claim in _claims(pod):
        found = claims.get(claim)
        if found is None:
            reasons.append(f"pod {name} needs PersistentVolumeClaim {claim}, which does not exist")
        elif (found.get("status") or {}).get("phase") != "Bound":
            storage_class = (found.get("spec") or {}).get("storageClassName") or "the cluster's default class"
            reasons.append(
                f"PersistentVolumeClaim {claim} is {(found.get('status') or {}).get('phase', 'Pending')} "
                f"(storage class: {storage_class}): no volume is bound; check the class exists and provisions "
                "(kubectl get storageclass), or set platform_katib_storage_class"
            )
    init = [(c, True) for c in status.get("initContainerStatuses") or []]
    for container, is_init in init + [(c, False) for c in status.get("containerStatuses") or []]:
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        said = f": {waiting['message'].strip()}" if (waiting.get("message") or "").strip() else ""
        label = f"pod {name} container {container.get('name', '?')}"
        if reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"):
            reasons.append(f"{label} cannot pull image {container.get('image', '?')} ({reason}{said})")
        elif reason == "CrashLoopBackOff":
            last = (container.get("lastState") or {}).get("terminated") or {}
            exit_said = f"{last.get('exitCode', '?')} {last.get('reason', '')}".strip()
            reasons.append(
                f"{label} keeps crashing ({container.get('restartCount', 0)} restarts, last exit {exit_said})"
            )
        elif reason:
            reasons.append(f"{label} waiting: {reason}{said}")
        elif "running" in state and not is_init and not container.get("ready", False):
            reasons.append(f"{label} running, not ready yet")
    return reasons


def wait_report(value: Any, namespace: str = "", expected: list[str] | None = None) -> dict[str, Any]:
    """{ready, not_ready: [names], message} for the Deployments, StatefulSets and DaemonSets of one namespace, from
    ``kubectl get deploy,statefulset,daemonset,pod,pvc -o json`` (a failed call: not ready, kubectl's error).
    ``expected`` ("Kind name"): only these count, and each must exist; others in the namespace are not ours."""
    where = f" in {namespace}" if namespace else ""
    try:
        items = _items(value)
    except ClusterError as error:
        return {"ready": False, "not_ready": [], "message": str(error)}
    workloads = [obj for obj in items if obj.get("kind") in WORKLOAD_KINDS]
    if expected is not None:
        workloads = [obj for obj in workloads if f"{obj['kind']} {_name(obj)}" in expected]
        present = {f"{obj['kind']} {_name(obj)}" for obj in workloads}
        missing = [name for name in expected if name not in present]
        if missing:
            return {"ready": False, "not_ready": missing, "message": f"{', '.join(missing)}{where}: not created yet"}
    pods = [
        obj for obj in items if obj.get("kind") == "Pod" and not (obj.get("metadata") or {}).get("deletionTimestamp")
    ]
    claims = {_name(obj): obj for obj in items if obj.get("kind") == "PersistentVolumeClaim"}
    if not workloads:
        return {"ready": False, "not_ready": [], "message": f"no Deployment, StatefulSet or DaemonSet{where} yet"}
    lines, not_ready = [], []
    for obj in workloads:
        if workload_available(obj):
            continue
        kind, name = obj["kind"], _name(obj)
        not_ready.append(f"{kind} {name}")
        status = obj.get("status") or {}
        wanted = (
            status.get("desiredNumberScheduled") if kind == "DaemonSet" else (obj.get("spec") or {}).get("replicas", 1)
        )
        available = status.get("numberAvailable" if kind == "DaemonSet" else "availableReplicas") or 0
        selector = (obj.get("spec") or {}).get("selector") or {}
        mine = [pod for pod in pods if _selects(selector, (pod.get("metadata") or {}).get("labels") or {})]
        reasons = [reason for pod in mine for reason in pod_reasons(pod, claims)]
        for condition in status.get("conditions") or []:
            if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
                reasons.append(f"cannot create pods: {(condition.get('message') or '').strip()}")
        if not mine and not reasons:
            reasons.append("no pod yet")
        lines.append(f"{kind} {name}{where}: {available} of {wanted} available; " + "; ".join(dict.fromkeys(reasons)))
    if not lines:
        return {"ready": True, "not_ready": [], "message": f"every operator{where} is available"}
    return {"ready": False, "not_ready": not_ready, "message": "\n".join(lines)}


def crd_problems(value: Any, wanted: dict[str, str]) -> list[str]:
    """One sentence per CRD of ``wanted`` ({name: version}) that the cluster lacks, does not serve at that version
    or has not established, from ``kubectl get crd -o json``."""
    crds = {
        _name(obj): obj
        for obj in _items(value)
        if obj.get("kind", "CustomResourceDefinition") == "CustomResourceDefinition"
    }
    problems = []
    for name, version in sorted((wanted or {}).items()):
        crd = crds.get(name)
        if crd is None:
            problems.append(f"{name} is not installed")
            continue
        served = [v.get("name") for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")]
        if version not in served:
            problems.append(f"{name} does not serve {version} (it serves {', '.join(served) or 'nothing'})")
        established = any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )
        if not established:
            problems.append(f"{name} is not Established")
    return problems


def _minor(version: str) -> tuple[int, int]:
    match = re.match(r"^v?(\d+)\.(\d+)", str(version))
    if not match:
        raise ClusterError(f"not a Kubernetes version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def version_problems(value: Any, releases: dict[str, Any], enabled: list[str]) -> list[str]:
    """The enabled components whose min_kubernetes is newer than the server, from ``kubectl version -o json``."""
    server = (_items(value) or [{}])[0].get("serverVersion") or {}
    if not server.get("gitVersion"):
        raise ClusterError("kubectl version printed no serverVersion (is the API server reachable?)")
    have = _minor(server["gitVersion"])
    return [
        f"{name} {releases[name]['version']} needs Kubernetes >= {releases[name]['min_kubernetes']}, the cluster "
        f"runs {server['gitVersion']}"
        for name in enabled
        if _minor(str(releases[name]["min_kubernetes"])) > have
    ]


def diff_objects(stdout: str) -> list[str]:
    """ "Kind namespace/name" of each object ``kubectl diff`` (with ``diff -q``) found different."""
    found = []
    for line in (stdout or "").splitlines():
        match = DIFF_LINE.match(line.strip())
        if not match:
            continue
        parsed = DIFF_NAME.match(PurePath(match.group(2)).name)
        if parsed:
            where = f"{parsed['namespace']}/" if parsed["namespace"] else ""
            found.append(f"{parsed['kind']} {where}{parsed['name']}")
        else:
            found.append(PurePath(match.group(2)).name)
    return found


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_platform_wait_report": wait_report,
            "dinops_platform_crd_problems": crd_problems,
            "dinops_platform_version_problems": version_problems,
            "dinops_platform_diff_objects": diff_objects,
        }
