"""The docker section's decisions (tasks/checks/workloads_docker.yml), pure Python, tested with real `docker inspect`
output captured into tests/fixtures/docker_inspect/ (tests/cluster/test_validate_docker_section.py):

- dinops_docker_plan: from the workloads stage's fact file and `docker inspect`, whether the docker runtime runs on
  this host, which containers need their last log lines, which container a CUDA probe can enter, the client's port;
- dinops_docker_results: the section's five checks (containers, inference_ready, detect_json, client_port,
  gpu_in_containers), each pass, fail or skip with a line for a person. A host that does not run the docker runtime
  skips every one of them: never a pass.

What the workloads role creates is its contract with this validator: containers named after the Kubernetes objects
(dinops-download and dinops-train are Jobs, dinops-serve and dinops-client Deployments with a HEALTHCHECK), labelled
dinops.io/kind, and the fact file /etc/ansible/facts.d/dinops_workloads.fact with "runtime": "docker".

Fields read, Docker Engine API v1.41 (ContainerInspect, https://docs.docker.com/reference/api/engine/version/v1.41/
#tag/Container/operation/ContainerInspect): Name, RestartCount, State.Status (created | running | paused |
restarting | removing | exited | dead), State.Restarting, State.ExitCode, State.Error, State.Health.Status
(starting | healthy | unhealthy), State.Health.FailingStreak and .Log[].ExitCode/.Output, Config.Labels, and
HostConfig.DeviceRequests[] (Driver, Count, DeviceIDs, Capabilities: `docker run --gpus all` stores Driver "" with
Capabilities [["gpu"]], https://docs.docker.com/reference/cli/docker/container/run/#gpus). `docker inspect a b`
prints the objects it found and exits 1 naming the others ("Error: No such object: b").
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ansible.errors import AnsibleFilterError

# The GPU section's filters (same role, its file): one reader of files/cuda_in_image.py's report.
_GPU_SPEC = importlib.util.spec_from_file_location("dinops_validate_gpu", Path(__file__).with_name("validate_gpu.py"))
validate_gpu = importlib.util.module_from_spec(_GPU_SPEC)
_GPU_SPEC.loader.exec_module(validate_gpu)

SECTION = "docker"
CHECKS = ("containers", "inference_ready", "detect_json", "client_port", "gpu_in_containers")
SERVE, CLIENT = "dinops-serve", "dinops-client"
# Kind of each container when its dinops.io/kind label is missing (the contract's names).
KINDS = {"dinops-download": "Job", "dinops-train": "Job", SERVE: "Deployment", CLIENT: "Deployment"}
# The containers that may hold a GPU, in the order a CUDA probe enters them (inference holds least memory).
GPU_CONTAINERS = (SERVE, "dinops-train")
NOT_HERE = "the docker runtime does not run on this host"
NO_GPU = "no NVIDIA GPU on the PCI bus"
DEFAULT_CLIENT_PORT = 30000


def _fact(fact, path: str) -> dict:
    """The fact file as a dict ({} when absent); text that is not a JSON object stops the run, naming the file."""
    if isinstance(fact, str):
        if not fact.strip():
            return {}
        try:
            fact = json.loads(fact)
        except ValueError as exc:
            raise AnsibleFilterError(
                f"the workloads fact file {path} (validate_docker_workloads_fact) is not JSON: {fact[:200]!r}"
            ) from exc
    if fact is None:
        return {}
    if not isinstance(fact, dict):
        raise AnsibleFilterError(f"the workloads fact file {path} holds {type(fact).__name__}, not a JSON object")
    return fact


def _why_not_here(fact: dict, path: str) -> str:
    """'' when the fact file says the docker runtime runs here, else why the section does not apply."""
    if not fact:
        return f"{NOT_HERE} ({path} absent: the workloads stage has not run here)"
    runtime = fact.get("runtime") or "kubernetes"
    if runtime != "docker":
        return f"{NOT_HERE} (the workloads stage recorded runtime {runtime})"
    return ""


def _inspected(inspect) -> dict:
    """`docker inspect` output (text or parsed) as {container name: object}."""
    if isinstance(inspect, str):
        try:
            inspect = json.loads(inspect) if inspect.strip() else []
        except ValueError as exc:
            raise AnsibleFilterError(f"docker inspect printed no JSON: {inspect[:200]!r}") from exc
    if isinstance(inspect, dict):
        inspect = [inspect]
    return {str(obj.get("Name", "")).lstrip("/"): obj for obj in inspect or [] if isinstance(obj, dict)}


def _kind(name: str, obj: dict) -> str:
    labels = (obj.get("Config") or {}).get("Labels") or {}
    return labels.get("dinops.io/kind") or KINDS.get(name, "Deployment")


def _container_state(name: str, obj: dict | None) -> tuple[bool, str]:
    """(healthy for its kind, what it is doing in words)."""
    if obj is None:
        return False, f"{name} missing (no such container)"
    state = obj.get("State") or {}
    status, code = state.get("Status", "unknown"), state.get("ExitCode", 0)
    error = f", {state['Error']}" if state.get("Error") else ""
    if state.get("Restarting") or status == "restarting":
        return False, f"{name} restarting (last exit code {code}, {obj.get('RestartCount', 0)} restarts{error})"
    if _kind(name, obj) == "Job":
        if status == "running":
            return True, f"{name} running"
        if status == "exited" and code == 0:
            return True, f"{name} completed (exit code 0)"
        if status == "exited":
            return False, f"{name} exited with code {code}{' (OOM killed)' if state.get('OOMKilled') else ''}{error}"
        return False, f"{name} {status}{error}"
    if status != "running":
        return False, f"{name} {status}" + (f" with code {code}" if status == "exited" else "") + error
    health = state.get("Health")
    if not health:
        return False, f"{name} running without a HEALTHCHECK (its image declares one)"
    if health.get("Status") == "healthy":
        return True, f"{name} running, healthy"
    if health.get("Status") == "starting":
        return False, (
            f"{name} still starting (health: starting): the workloads stage waits for health before it records "
            "the fact file, so it has not become healthy since"
        )
    last = (health.get("Log") or [{}])[-1]
    said = (last.get("Output") or "").strip().replace("\n", " ")[-200:]
    return False, (
        f"{name} {health.get('Status', 'unknown')} ({health.get('FailingStreak', 0)} failed health checks in a row; "
        f"last exit code {last.get('ExitCode', '?')}{': ' + said if said else ''})"
    )


def _workloads(fact: dict) -> list[str]:
    workloads = fact.get("workloads") or []
    if not isinstance(workloads, list) or not all(isinstance(w, str) for w in workloads):
        raise AnsibleFilterError(f"the workloads fact file's 'workloads' is not a list of names: {workloads!r}")
    return workloads


def _gpu_request(obj: dict) -> bool:
    for request in (obj.get("HostConfig") or {}).get("DeviceRequests") or []:
        if request.get("Driver") == "nvidia" or any("gpu" in caps for caps in request.get("Capabilities") or []):
            return True
    return False


def dinops_docker_plan(fact, inspect=None, fact_path: str = "", client_port: int = 0) -> dict:
    """{docker, why_not, workloads, unwell: [names whose logs to read], gpu_container, gpu_requests, client_port}."""
    fact = _fact(fact, fact_path)
    why_not = _why_not_here(fact, fact_path)
    if why_not:
        return {"docker": False, "why_not": why_not, "workloads": [], "unwell": [], "gpu_container": "",
                "gpu_requests": [], "client_port": 0}  # fmt: skip
    workloads = _workloads(fact)
    containers = _inspected(inspect)
    unwell = [name for name in workloads if name in containers and not _container_state(name, containers[name])[0]]
    requests = [name for name in GPU_CONTAINERS if name in containers and _gpu_request(containers[name])]
    running = [name for name in requests if (containers[name].get("State") or {}).get("Status") == "running"]
    port = int(client_port or fact.get("client_port") or DEFAULT_CLIENT_PORT)
    return {"docker": True, "why_not": "", "workloads": workloads, "unwell": unwell,
            "gpu_container": running[0] if running else "", "gpu_requests": requests, "client_port": port}  # fmt: skip


def _log_lines(result: dict) -> str:
    """`docker logs --tail 5 --timestamps` output, stdout and stderr merged in time order, timestamps dropped."""
    lines = [*(result.get("stdout_lines") or []), *(result.get("stderr_lines") or [])]
    lines = sorted(line for line in lines if line.strip())
    text = " | ".join(line.split(" ", 1)[1] if " " in line else line for line in lines)
    return text[-600:]


def _containers(plan: dict, containers: dict, logs: dict) -> dict:
    if not plan["workloads"]:
        return {"status": "skip", "detail": "the workloads stage applied no container on this host"}
    states, failed = [], False
    for name in plan["workloads"]:
        ok, said = _container_state(name, containers.get(name))
        failed = failed or not ok
        if not ok and logs.get(name):
            said += f"; last log lines: {logs[name]}"
        states.append(said)
    return {"status": "fail" if failed else "pass", "detail": "; ".join(states)}


def _probe_report(result: dict) -> tuple[dict, str]:
    """The API probe's JSON line (templates/docker_api_probe.py.j2), or {} and why there is none."""
    result = result or {}
    lines = [line for line in result.get("stdout_lines") or [] if line.strip()]
    if result.get("rc") == 0 and lines:
        try:
            report = json.loads(lines[-1])
        except ValueError:
            return {}, f"the probe printed no JSON: {lines[-1][:200]}"
        if report.get("error"):
            return report, report["error"]
        return report, ""
    said = (result.get("stderr") or result.get("msg") or "no output").strip()
    return {}, f"docker exec {SERVE} failed (exit code {result.get('rc', '?')}): {said[-300:]}"


def _detections_shape(answer, sent) -> str:
    """'' when ``answer`` is docs/api.md's POST /v1/detect body for an image of ``sent`` [width, height]."""
    if not isinstance(answer, dict) or not isinstance(answer.get("detections"), list):
        return f"no detections list in {json.dumps(answer)[:200]}"
    if [answer.get("width"), answer.get("height")] != list(sent):
        return f"width and height {answer.get('width')}x{answer.get('height')}, sent {sent[0]}x{sent[1]}"
    for item in answer["detections"]:
        box = item.get("box") if isinstance(item, dict) else None
        numbers = isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)
        if not (
            numbers
            and isinstance(item.get("label"), int)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("score"), (int, float))
            and 0 <= item["score"] <= 1
        ):
            return f"a detection is not {{box: [x1, y1, x2, y2], label, name, score}}: {json.dumps(item)[:200]}"
    return ""


def _inference(plan: dict, fact: dict, api_result: dict) -> tuple[dict, dict]:
    if SERVE not in plan["workloads"]:
        skip = {
            "status": "skip",
            "detail": "inference is not deployed on this host (the fact file lists no dinops-serve)",
        }
        return skip, skip
    report, error = _probe_report(api_result)
    if error:
        return {"status": "fail", "detail": error}, {"status": "skip", "detail": "not probed: inference did not answer"}
    health, ready = report.get("health") or {}, report.get("ready") or {}
    model, checkpoint = health.get("model"), health.get("checkpoint") or "the configured checkpoint"
    serve = fact.get("serve") or {}
    if model == "waiting":
        advice = serve.get("message") if serve.get("state") == "waiting" and serve.get("message") else ""
        said = ready.get("error") or f"waiting for a model at {checkpoint}"
        train = fact.get("train")
        detail = said + (f" ({advice})" if advice else "") + (f"; training: {train}" if train else "")
        skip = {"status": "skip", "detail": detail}
        return skip, {"status": "skip", "detail": "waiting for a model: nothing to detect with yet"}
    if model == "loading":
        skip = {"status": "skip", "detail": f"the model at {checkpoint} is still loading"}
        return skip, {"status": "skip", "detail": "the model is still loading: nothing to detect with yet"}
    if model == "failed":
        fail = {"status": "fail", "detail": f"the model at {checkpoint} failed to load: {health.get('error', '?')}"}
        return fail, {"status": "skip", "detail": "not probed: the model failed to load"}
    if model != "ready" or report.get("readyz") != 200:
        fail = {"status": "fail", "detail": f"GET /healthz answered {report.get('healthz')} model {model!r}, "
                f"GET /readyz answered {report.get('readyz')} {json.dumps(ready)[:200]}"}  # fmt: skip
        return fail, {"status": "skip", "detail": "not probed: inference is not ready"}
    ready_verdict = {
        "status": "pass",
        "detail": f"model ready: {checkpoint} on {ready.get('device', '?')} ({ready.get('backend', '?')} backend)",
    }
    answer, sent = report.get("answer"), report.get("sent") or [0, 0]
    if report.get("detect") != 200:
        said = answer.get("error", "") if isinstance(answer, dict) else ""
        return ready_verdict, {"status": "fail", "detail": f"POST /v1/detect answered {report.get('detect')}: {said}"}
    problem = _detections_shape(answer, sent)
    if problem:
        return ready_verdict, {"status": "fail", "detail": f"POST /v1/detect answered 200, but {problem}"}
    return ready_verdict, {
        "status": "pass",
        "detail": f"POST /v1/detect answered 200 with {len(answer['detections'])} detections of docs/api.md's shape "
        f"on a {sent[0]}x{sent[1]} test PNG",
    }


def _client(plan: dict, client_results, client_base: str) -> dict:
    if CLIENT not in plan["workloads"]:
        return {
            "status": "skip",
            "detail": "the client is not deployed on this host (the fact file lists no dinops-client)",
        }
    base = f"{client_base}:{plan['client_port']}"
    answers = {r.get("validate_client_path", r.get("url", "")): r for r in client_results or [] if isinstance(r, dict)}
    problems = []
    for path in ("/healthz", "/"):
        answer = answers.get(path) or {}
        html = path == "/healthz" or str(answer.get("content_type", "")).startswith("text/html")
        if answer.get("status") != 200 or not html:
            # uri reports status -1 when nothing answered, with the reason in msg.
            status = answer.get("status") if (answer.get("status") or 0) > 0 else "nothing"
            what = f" {answer.get('content_type')}, not an HTML page" if answer.get("status") == 200 else ""
            problems.append(f"GET {base}{path} answered {status}{what} ({answer.get('msg', 'not asked')})")
    if problems:
        return {"status": "fail", "detail": "; ".join(problems)}
    return {"status": "pass", "detail": f"GET {base}/healthz answered 200 and {base}/ an HTML page"}


def _gpu(plan: dict, fact: dict, pci_gpus, gpu_result: dict) -> dict:
    if int(pci_gpus or 0) == 0:
        return {"status": "skip", "detail": NO_GPU}
    if int(fact.get("gpus") or 0) == 0:
        return {"status": "skip", "detail": "CPU host: the workloads stage gave the containers no GPU (gpus 0)"}
    candidates = [name for name in GPU_CONTAINERS if name in plan["workloads"]]
    if not plan["gpu_requests"]:
        return {"status": "fail", "detail": f"the fact file gives the containers {fact.get('gpus')} GPUs, but none of "
                f"{', '.join(candidates) or 'dinops-serve, dinops-train'} has a GPU device request"}  # fmt: skip
    if not plan["gpu_container"]:
        return {"status": "skip", "detail": f"{', '.join(plan['gpu_requests'])} has a GPU device request but does "
                "not run now: nothing to probe CUDA in"}  # fmt: skip
    result = gpu_result or {}
    report = validate_gpu.probe_report(result.get("stdout")) or {}
    devices = report.get("devices") or []
    where = f"in {plan['gpu_container']}"
    if result.get("rc") == 0 and devices and not report.get("error"):
        names = "; ".join(f"cuda:{d.get('index')} {d.get('name')}" for d in devices)
        return {"status": "pass", "detail": f"CUDA computed {where}: {names} (torch {report.get('torch')}, CUDA "
                f"{report.get('cuda')})"}  # fmt: skip
    error = report.get("error") or (result.get("stderr") or result.get("msg") or "no output").strip()
    if "out of memory" in str(error).lower():
        return {"status": "skip", "detail": f"GPU memory is full {where}, the probe cannot run there: {error}"}
    return {"status": "fail", "detail": f"CUDA probe {where} failed: {error}"}


def dinops_docker_results(
    fact,
    inspect=None,
    logs=None,
    api=None,
    client=None,
    pci_gpus=0,
    gpu=None,
    fact_path="",
    client_port=0,
    client_base="http://127.0.0.1",
) -> list[dict]:
    """The section's results: [{section, check, status, detail}] in CHECKS order.

    ``fact``: the fact file's text; ``inspect``: `docker inspect <workloads>` stdout; ``logs``: the registered loop of
    `docker logs` over the plan's ``unwell`` (each result carries ``validate_container``); ``api``: the registered
    `docker exec dinops-serve python3 -c <probe>`; ``client``: the registered uri loop (``validate_client_path``);
    ``pci_gpus``: gpu_host's count; ``gpu``: the registered CUDA probe inside the plan's ``gpu_container``;
    ``client_base``: scheme and host the client was asked at (https and the published address when public)."""
    plan = dinops_docker_plan(fact, inspect, fact_path, client_port)
    if not plan["docker"]:
        return [{"section": SECTION, "check": c, "status": "skip", "detail": plan["why_not"]} for c in CHECKS]
    fact = _fact(fact, fact_path)
    log_lines = {r.get("validate_container"): _log_lines(r) for r in (logs or {}).get("results") or []}
    verdicts = {"containers": _containers(plan, _inspected(inspect), log_lines)}
    verdicts["inference_ready"], verdicts["detect_json"] = _inference(plan, fact, api or {})
    verdicts["client_port"] = _client(plan, (client or {}).get("results"), client_base)
    verdicts["gpu_in_containers"] = _gpu(plan, fact, pci_gpus, gpu or {})
    return [{"section": SECTION, "check": c} | verdicts[c] for c in CHECKS]


class FilterModule:
    """Docker section filters."""

    def filters(self):
        return {
            "dinops_validate_docker_plan": dinops_docker_plan,
            "dinops_validate_docker_results": dinops_docker_results,
        }
