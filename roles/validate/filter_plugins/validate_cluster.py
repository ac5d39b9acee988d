"""The cluster section's decisions that need more than a comparison, each tested with API-shaped objects
(tests/cluster/test_validate_cluster_section.py):

- dinops_gpu_probe_plan: where CUDA can be probed without asking for a GPU that serve or train holds: a new pod when
  a GPU is free, else inside the running GPU pod of the workloads, else nowhere (skip, with the reason);
- dinops_gpu_pod_verdict: what that probe showed (never a pass without a device that computed);
- dinops_inference_verdicts: inference_ready, detect_json and client_nodeport, skipped with the workloads stage's
  own words when inference waits for a model (the fact file roles/workloads writes) or a part was not deployed.

Fields read (Kubernetes v1.33 API reference): NodeStatus.allocatable
(https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/node-v1/#NodeStatus), PodSpec.nodeName,
containers[].resources, initContainers[].resources, PodStatus.phase and containerStatuses[].state
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/). A pod's effective request of a
resource is the larger of the sum over its containers and the largest init container's
(https://kubernetes.io/docs/concepts/workloads/pods/init-containers/#resource-sharing-within-containers); an
extended resource such as nvidia.com/gpu is given as a limit, and its request defaults to it
(https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ansible.errors import AnsibleFilterError


def _load_validate_gpu():
    """The GPU section's filters (same role, its file): one reader of the CUDA probe's report for both sections."""
    spec = importlib.util.spec_from_file_location("dinops_validate_gpu", Path(__file__).with_name("validate_gpu.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


validate_gpu = _load_validate_gpu()

GPU = "nvidia.com/gpu"
NAMESPACE = "dinops"
# The workloads whose pods hold a GPU, in the order they are probed in (inference holds least memory).
GPU_WORKLOADS = ("dinops-serve", "dinops-train")
NO_GPU = "no NVIDIA GPU on the PCI bus"


def _parsed(value, what: str):
    """JSON text parsed (empty text is {}), anything else as it is; ``what`` names the source in the error."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value) if value.strip() else {}
    except ValueError as exc:
        raise AnsibleFilterError(f"{what}: {value[:200]!r}") from exc


def _items(value) -> list:
    value = _parsed(value, "kubectl printed no JSON")
    if isinstance(value, dict):
        return list(value.get("items") or [])
    if isinstance(value, list):
        return value
    raise AnsibleFilterError(f"expected kubectl's JSON or a list of objects, got {type(value).__name__}")


def _gpus(resources) -> int:
    resources = resources or {}
    value = (resources.get("requests") or {}).get(GPU, (resources.get("limits") or {}).get(GPU, 0))
    return int(value)


def _pod_gpus(pod) -> int:
    spec = pod.get("spec") or {}
    main = sum(_gpus(c.get("resources")) for c in spec.get("containers") or [])
    init = max([_gpus(c.get("resources")) for c in spec.get("initContainers") or []] or [0])
    return max(main, init)


def _holds_gpu(pod) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and _pod_gpus(pod) > 0


def _name(obj) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '?')}/{metadata.get('name', '?')}"


def _probe_container(pod, workload) -> str:
    """The running container of a dinops ``workload`` pod that holds a GPU ('' when this pod is not one)."""
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels = metadata.get("labels") or {}
    if metadata.get("namespace") != NAMESPACE or labels.get("app.kubernetes.io/name") != workload:
        return ""
    if status.get("phase") != "Running" or metadata.get("deletionTimestamp"):
        return ""
    running = {c.get("name") for c in status.get("containerStatuses") or [] if "running" in (c.get("state") or {})}
    for container in (pod.get("spec") or {}).get("containers") or []:
        if _gpus(container.get("resources")) > 0 and container.get("name") in running:
            return container["name"]
    return ""


def dinops_gpu_probe_plan(nodes, pods) -> dict:
    """{mode: pod | exec | skip, reason, free, allocatable, namespace, pod, container}.

    pod: a GPU is free (or none is allocatable at all: the probe pod then shows that); exec: every GPU is held and a
    running dinops GPU pod can run the probe; skip: every GPU is held by pods the probe cannot enter."""
    nodes, pods = _items(nodes), _items(pods)
    allocatable = {
        (n.get("metadata") or {}).get("name"): int(((n.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
        for n in nodes
    }
    holders = [p for p in pods if _holds_gpu(p) and (p.get("spec") or {}).get("nodeName") in allocatable]
    requested = dict.fromkeys(allocatable, 0)
    for pod in holders:
        requested[pod["spec"]["nodeName"]] += _pod_gpus(pod)
    free = sum(max(0, allocatable[node] - requested[node]) for node in allocatable)
    total = sum(allocatable.values())
    plan = {"free": free, "allocatable": total, "namespace": NAMESPACE, "pod": "", "container": ""}
    if free > 0 or total == 0:
        return plan | {"mode": "pod", "reason": f"{free} of {total} nvidia.com/gpu free: a probe pod asks for one"}
    held_by = ", ".join(_name(p) for p in holders)
    for workload in GPU_WORKLOADS:
        for pod in holders:
            container = _probe_container(pod, workload)
            if container:
                return plan | {
                    "mode": "exec",
                    "pod": pod["metadata"]["name"],
                    "container": container,
                    "reason": f"every nvidia.com/gpu is held ({held_by}): CUDA probed inside {_name(pod)}",
                }
    return plan | {
        "mode": "skip",
        "reason": f"every nvidia.com/gpu is held ({held_by or 'by pods not listed'}) and no running dinops GPU pod "
        "can run the probe; run verify again when one runs, or before the workloads stage",
    }


def dinops_gpu_pod_verdict(plan, gpus, pod_result=None, exec_result=None) -> dict:
    """{status, detail} of gpu_pod: the probe pod's output, or files/cuda_in_image.py's report from inside the
    workloads' GPU pod, or the plan's reason to skip."""
    if int(gpus) == 0:
        return {"status": "skip", "detail": NO_GPU}
    plan = plan or {}
    if plan.get("mode") == "skip":
        return {"status": "skip", "detail": plan.get("reason", "")}
    if plan.get("mode") == "exec":
        result = exec_result or {}
        report = validate_gpu.probe_report(result.get("stdout")) or {}
        where = f"in {plan.get('namespace')}/{plan.get('pod')} ({plan.get('container')})"
        devices = report.get("devices") or []
        if result.get("rc") == 0 and devices and not report.get("error"):
            names = "; ".join(f"cuda:{d.get('index')} {d.get('name')}" for d in devices)
            return {
                "status": "pass",
                "detail": f"CUDA computed {where}: {names} (torch {report.get('torch')}, CUDA {report.get('cuda')})",
            }
        error = report.get("error") or (result.get("stderr") or result.get("msg") or "no output").strip()
        if "out of memory" in str(error).lower():
            return {"status": "skip", "detail": f"GPU memory is full {where}, the probe cannot run there: {error}"}
        return {"status": "fail", "detail": f"CUDA probe {where} failed: {error}"}
    result = pod_result or {}
    ok = result.get("rc", 1) == 0
    lines = result.get("stdout_lines") or []
    detail = "; ".join(lines[-3:]) or (result.get("stderr") or result.get("msg") or "").strip()
    return {"status": "pass" if ok else "fail", "detail": detail}


def _fact(fact) -> dict:
    fact = _parsed(fact, "the workloads fact file is not JSON")
    return fact if isinstance(fact, dict) else {}


def dinops_inference_verdicts(api, fact=None, client=None, nodeport=30000, client_base="http://127.0.0.1") -> dict:
    """{inference_ready, detect_json, client_nodeport: {status, detail}}.

    ``api``: files/cluster_api_probe.py's JSON from the client pod ({} when it did not run); ``fact``: the workloads
    stage's fact file (what it applied, where inference stood); ``client``: the uri result of the client's NodePort,
    asked at ``client_base`` (https and the published address when the client is public)."""
    api = api if isinstance(api, dict) else {}
    fact = _fact(fact)
    applied = fact.get("workloads")
    verdicts = {}
    serve = fact.get("serve") or {}
    model = api.get("model") or ("waiting" if serve.get("state") == "waiting" else serve.get("state"))
    if applied is not None and "dinops-serve" not in applied:
        skip = {"status": "skip", "detail": "inference is not deployed on this host (the profile lists no inference)"}
        verdicts["inference_ready"] = verdicts["detect_json"] = skip
    elif applied is not None and "dinops-client" not in applied:
        skip = {"status": "skip", "detail": "no client pod to probe inference from (the profile lists no client)"}
        verdicts["inference_ready"] = verdicts["detect_json"] = skip
    elif api.get("readyz") != 200 and model in ("waiting", "loading"):
        path = api.get("checkpoint") or serve.get("checkpoint") or "the configured checkpoint"
        said = serve.get("message") if serve.get("state") == model else ""
        detail = (
            f"waiting for a model at {path}" + (f" ({said})" if said else "")
            if model == "waiting"
            else f"the model at {path} is still loading"
        )
        verdicts["inference_ready"] = verdicts["detect_json"] = {"status": "skip", "detail": detail}
    else:
        verdicts["inference_ready"] = {
            "status": "pass" if api.get("readyz") == 200 else "fail",
            "detail": f"GET dinops-serve:8000/readyz answered {api.get('readyz', api.get('error', 'no answer'))}",
        }
        verdicts["detect_json"] = {
            "status": "pass" if api.get("detect") == 200 and "detections" in api.get("keys", []) else "fail",
            "detail": f"POST /v1/detect answered {api.get('detect', api.get('error', 'nothing'))} with keys "
            f"{','.join(api.get('keys', []))} ({api.get('detections', 0)} detections on a plain test image)",
        }
    if applied is not None and "dinops-client" not in applied:
        verdicts["client_nodeport"] = {"status": "skip", "detail": "the client is not deployed on this host"}
    else:
        client = client if isinstance(client, dict) else {}
        status = client.get("status", 0)
        why = f" ({client.get('msg')})" if status != 200 and client.get("msg") else ""
        verdicts["client_nodeport"] = {
            "status": "pass" if status == 200 else "fail",
            "detail": f"GET {client_base}:{nodeport}/ answered {status or 'nothing'}{why}",
        }
    return verdicts


class FilterModule:
    """Cluster section filters."""

    def filters(self):
        return {
            "dinops_gpu_probe_plan": dinops_gpu_probe_plan,
            "dinops_gpu_pod_verdict": dinops_gpu_pod_verdict,
            "dinops_inference_verdicts": dinops_inference_verdicts,
        }
