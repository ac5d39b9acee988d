"""The monitoring section's decisions (tasks/checks/workloads_monitoring.yml), pure Python, tested with answers in the
Prometheus API's shape and with the real Prometheus binary (tests/cluster/test_validate_monitoring_section.py):

- dinops_monitoring_plan: whether this host runs the deployment's Prometheus, on which runtime, and the command that
  enters its container (docker exec dinops-prometheus, or kubectl exec deploy/dinops-prometheus -c prometheus);
- dinops_monitoring_results: the section's checks, each pass, fail or skip with a line for a person:
  prometheus_ready (GET /-/ready), scrape_serve, scrape_train and scrape_dcgm (the scrape jobs dinops-serve,
  dinops-train and dcgm-exporter of k8s/components/monitoring/prometheus/prometheus.yml) and alerts.

Decisions, per scrape job: every active target up passes; a target down fails, naming the job, the target's scrape
URL and Prometheus' lastError; a target not scraped yet (health unknown, right after Prometheus started) is a skip
saying so. With no active target: dinops-serve fails (nothing scrapes the API); dinops-train fails when a training
container or pod runs and is a skip when none does (the Job finished or has not started: its headless Service then
resolves to no address); dcgm-exporter fails on a GPU host (NVIDIA GPUs on the PCI bus) and is a skip
elsewhere and on the Docker runtime (which runs no DaemonSet). A dinops-train job with several targets of which one
is up passes: only process 0 of a run on several nodes serves metrics. On
the Docker runtime the training container runs its data gate (`dinops data-ready`) before the trainer, which serves
no metrics yet: a dinops-train target that is down while the run's progress.json says waiting_for_data is a skip with
the gate's reason. Alerts are warnings about the run, not about the deployment: firing alerts of severity critical
fail, any other firing alert passes with its name in the line, pending ones are not counted.

Answer shapes, Prometheus v2.42.0 docs/querying/api.md (https://github.com/prometheus/prometheus/blob/v2.42.0/docs/
querying/api.md): every answer {"status": "success" | "error", "data", "error"}; "Targets": data.activeTargets[]
with labels (job among them), scrapeUrl, lastError and health, one of "up", "down", "unknown" (scrape/target.go
HealthGood/HealthBad/HealthUnknown); "Alerts": data.alerts[] with labels (alertname, and the rule's labels such as
severity) and state "pending" or "firing" (rules/alerting.go). GET /-/ready answers 200 once the server is ready,
else 503 "Service Unavailable" (web/web.go testReady). The probe (files/prometheus_probe.py) prints these answers
reduced to the fields read here, in the same shape.
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

SECTION = "monitoring"
CHECKS = ("prometheus_ready", "scrape_serve", "scrape_train", "scrape_dcgm", "alerts")
# Check name -> Prometheus scrape job (k8s/components/monitoring/prometheus/prometheus.yml; the shared contract).
JOBS = {"scrape_serve": "dinops-serve", "scrape_train": "dinops-train", "scrape_dcgm": "dcgm-exporter"}
# The contract's names: the container on the Docker runtime, the Deployment and its container on Kubernetes.
PROMETHEUS = "dinops-prometheus"
CONTAINER = "prometheus"
NAMESPACE = "dinops"
TRAIN = "dinops-train"
NO_GPU = "no NVIDIA GPU on the PCI bus"


def _json(text, what: str):
    if not isinstance(text, str):
        return text
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise AnsibleFilterError(f"{what} is not JSON: {text[:200]!r}") from exc


def dinops_monitoring_plan(
    docker_plan=None, kubeconfig_exists=False, deployment=None, kubectl="kubectl", kubeconfig=""
) -> dict:
    """{runtime: docker | kubernetes | "", why_not, error, exec: argv that runs a command in Prometheus' container}.

    ``docker_plan``: the docker section's plan (validate_docker.py: docker, workloads from the fact file);
    ``kubeconfig_exists``: whether the cluster section found the stage kubeconfig; ``deployment``: the registered
    `kubectl get deployment dinops-prometheus` (rc, stderr) on such a host. ``error`` is set when the cluster could
    not be asked: a fail, not a skip."""
    plan = {"runtime": "", "why_not": "", "error": "", "exec": []}
    docker_plan = docker_plan or {}
    if docker_plan.get("docker"):
        if PROMETHEUS not in (docker_plan.get("workloads") or []):
            return plan | {"why_not": f"monitoring is off: the workloads stage applied no {PROMETHEUS} container "
                           "on this host (workloads_monitoring)"}  # fmt: skip
        return plan | {"runtime": "docker", "exec": ["docker", "exec", PROMETHEUS]}
    if not kubeconfig_exists:
        return plan | {"why_not": "neither the docker runtime nor a cluster's kubeconfig on this host: no Prometheus "
                       "of the deployment to ask here"}  # fmt: skip
    result = deployment or {}
    if result.get("rc") != 0:
        said = (result.get("stderr") or result.get("msg") or "no output").strip()
        if "NotFound" in said or "not found" in said:
            return plan | {"why_not": f"monitoring is off: no Deployment {PROMETHEUS} in namespace {NAMESPACE}"}
        return plan | {"error": f"kubectl get deployment {PROMETHEUS} --namespace={NAMESPACE} failed: {said[-300:]}"}
    command = [kubectl] + ([f"--kubeconfig={kubeconfig}"] if kubeconfig else [])
    command += [f"--namespace={NAMESPACE}", "exec", f"deploy/{PROMETHEUS}", f"--container={CONTAINER}", "--"]
    return plan | {"runtime": "kubernetes", "exec": command}


def _probe(result: dict) -> tuple[dict, str]:
    """The probe's JSON line, or {} and why there is none."""
    where = "the Prometheus probe"
    if not result:
        return {}, f"{where} did not run"
    lines = [line for line in result.get("stdout_lines") or (result.get("stdout") or "").splitlines() if line.strip()]
    if result.get("rc") != 0:
        said = (result.get("stderr") or result.get("msg") or "no output").strip().replace("\n", " ")
        return {}, f"{where} exited with code {result.get('rc')}: {said[-300:]}"
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {}, f"{where} printed no JSON line: {(result.get('stdout') or '')[-200:]!r}"
    if not isinstance(report, dict):
        return {}, f"{where} printed {type(report).__name__}, not a JSON object"
    return report, ""


def _answer(report: dict, key: str, field: str, path: str) -> tuple[list | None, str]:
    """data[field] of the API answer under ``key`` of the probe's line, or None and why it cannot be read."""
    answer = report.get(key)
    if not isinstance(answer, dict):
        return None, f"the probe has no answer of {path}"
    if answer.get("status") != "success":
        return None, f"Prometheus' {path} answered {answer.get('status')!r}: {answer.get('error', 'no error given')}"
    items = (answer.get("data") or {}).get(field) if isinstance(answer.get("data"), dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return None, f"Prometheus' {path} answer has no list data.{field}: {json.dumps(answer)[:200]}"
    return items, ""


def dinops_monitoring_settled(result) -> bool:
    """Whether the probe's answer is final: Prometheus ready and every active target up, or nothing to wait for (no
    probe, no JSON, an answer not in the API's shape). The task asks again a few times while it is not: a container
    started seconds before, or a trainer importing its libraries, is down or unknown until the next scrape
    (scrape_interval 15 s), which is not a fault."""
    report, why = _probe(result if isinstance(result, dict) else {})
    if why:
        return True
    ready = report.get("ready") if isinstance(report.get("ready"), dict) else {}
    targets, why = _answer(report, "targets", "activeTargets", "GET /api/v1/targets")
    return bool(why) or (ready.get("status") == 200 and all(t.get("health") == "up" for t in targets))


def _ready(report: dict) -> dict:
    ready = report.get("ready") if isinstance(report.get("ready"), dict) else {}
    said = f"GET /-/ready answered {ready.get('status')}: {ready.get('body', '')}"
    if ready.get("status") == 200:
        return {"status": "pass", "detail": said}
    if ready.get("status") is None:
        return {"status": "fail", "detail": f"Prometheus does not answer on 127.0.0.1:9090 in its container: "
                f"{ready.get('body', 'no answer')}"}  # fmt: skip
    return {"status": "fail", "detail": f"{said} (still starting: replaying its write-ahead log, or stuck)"}


def _training(plan: dict, inspect, pods, progress) -> dict:
    """{running: bool, detail, waiting: the data gate's reason or ""}, from the docker section's `docker inspect`,
    `kubectl get pods -l app.kubernetes.io/name=dinops-train` (the selector of the headless Service
    dinops-train-metrics) and, on Docker, the run's progress.json."""
    if plan["runtime"] == "docker":
        objects = _json(inspect, "docker inspect's output") or []
        objects = [objects] if isinstance(objects, dict) else objects
        train = next((o for o in objects if isinstance(o, dict) and str(o.get("Name", "")).lstrip("/") == TRAIN), None)
        if train is None:
            return {"running": False, "detail": f"no {TRAIN} container on this host", "waiting": ""}
        state = train.get("State") or {}
        if state.get("Status") != "running":
            return {"running": False, "waiting": "", "detail": f"{TRAIN} is {state.get('Status', 'unknown')}"
                    + (f" (exit code {state.get('ExitCode')})" if state.get("Status") == "exited" else "")}  # fmt: skip
        document = {}
        if (progress or {}).get("rc") == 0:
            try:
                document = json.loads(progress.get("stdout") or "")
            except ValueError:
                document = {}
        waiting = ""
        if isinstance(document, dict) and document.get("state") == "waiting_for_data":
            waiting = str(document.get("reason") or "its progress.json says waiting_for_data")
        return {"running": True, "detail": f"{TRAIN} is running", "waiting": waiting}
    listed = (pods or {}).get("stdout") if (pods or {}).get("rc") == 0 else ""
    items = (_json(listed, "kubectl get pods' output") or {}).get("items") or []
    running, states = [], []
    for pod in items:
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        if any("running" in (c.get("state") or {}) for c in status.get("containerStatuses") or []):
            running.append(name)
        states.append(f"{name} {status.get('phase', 'unknown')}")
    if running:
        return {"running": True, "detail": f"training pod {', '.join(running)} is running", "waiting": ""}
    detail = ("training pods: " + ", ".join(states) + " (none has a running container)") if states else (
        "no training pod (the Job finished and was cleaned up, or has not started)")  # fmt: skip
    return {"running": False, "detail": detail, "waiting": ""}


def _job(check: str, targets: list, training: dict, pci_gpus: int, runtime: str = "") -> dict:
    job = JOBS[check]
    mine = [t for t in targets if (t.get("labels") or {}).get("job") == job]
    down = [t for t in mine if t.get("health") not in ("up", "unknown")]
    unknown = [t for t in mine if t.get("health") == "unknown"]
    up = [t for t in mine if t.get("health") == "up"]
    if down:
        said = "; ".join(f"{t.get('scrapeUrl')} is {t.get('health')}: {t.get('lastError') or 'no error given'}"
                         for t in down)  # fmt: skip
        if job == TRAIN and up:
            # A run on several nodes (TrainJob, PyTorchJob): every training pod is an address of the headless
            # Service, and only process 0 serves metrics (apps/src/dinops/train/metrics.py).
            return {"status": "pass", "detail": f"job {job}: {len(up)} target(s) up ("
                    + ", ".join(str(t.get("scrapeUrl")) for t in up) + f"); the other training pods serve no "
                    f"metrics, only process 0 does: {said}"}  # fmt: skip
        if job == TRAIN and training.get("waiting"):
            return {"status": "skip", "detail": f"job {job}: {said}; training waits for its dataset, before the "
                    f"trainer serves metrics: {training['waiting']}"}  # fmt: skip
        return {"status": "fail", "detail": f"job {job}: {said}"}
    if unknown:
        urls = ", ".join(str(t.get("scrapeUrl")) for t in unknown)
        return {"status": "skip", "detail": f"job {job}: {urls} not scraped yet (health unknown: Prometheus found it "
                "less than a scrape interval ago); run the validator again in a minute"}  # fmt: skip
    if mine:
        return {"status": "pass", "detail": f"job {job}: {len(mine)} target(s) up: "
                + ", ".join(str(t.get("scrapeUrl")) for t in mine)}  # fmt: skip
    if job == "dinops-serve":
        return {"status": "fail", "detail": f"job {job} has no active target: nothing scrapes the API (does the "
                "headless Service dinops-serve-metrics, or dinops-predictor-metrics with KServe, resolve to the API's "
                "address?)"}  # fmt: skip
    if job == TRAIN:
        if training.get("running"):
            return {"status": "fail", "detail": f"job {job} has no active target while {training['detail']}: "
                    "its metrics are not scraped (headless Service dinops-train-metrics, port 9109)"}  # fmt: skip
        return {"status": "skip", "detail": f"job {job} has no active target and no training runs: "
                f"{training['detail']}"}  # fmt: skip
    if runtime == "docker":
        return {"status": "skip", "detail": f"job {job} has no active target: the Docker runtime runs no DCGM "
                "exporter (a DaemonSet of the Kubernetes layer; docs/monitoring-gpu.md)"}  # fmt: skip
    if pci_gpus > 0:
        return {"status": "fail", "detail": f"job {job} has no active target on a host with {pci_gpus} NVIDIA "
                "GPU(s): the GPUs' utilisation is not scraped (DaemonSet dinops-dcgm-exporter, Service "
                "dcgm-exporter)"}  # fmt: skip
    return {"status": "skip", "detail": f"job {job} has no active target: {NO_GPU}, no DCGM exporter expected"}


def _alerts(alerts: list) -> dict:
    firing = [a for a in alerts if a.get("state") == "firing"]
    pending = len(alerts) - len(firing)

    def name(alert):
        labels = alert.get("labels") or {}
        return f"{labels.get('alertname', '?')} ({labels.get('severity') or 'no severity'})"

    critical = [name(a) for a in firing if (a.get("labels") or {}).get("severity") == "critical"]
    others = [name(a) for a in firing if (a.get("labels") or {}).get("severity") != "critical"]
    tail = f"; {pending} pending" if pending else ""
    if critical:
        return {"status": "fail", "detail": "critical alerts firing: " + ", ".join(critical)
                + (f"; also firing: {', '.join(others)}" if others else "") + tail}  # fmt: skip
    if others:
        return {"status": "pass", "detail": "firing (warnings about the run, not the deployment): "
                + ", ".join(others) + tail}  # fmt: skip
    return {"status": "pass", "detail": "no alert firing" + tail}


def dinops_monitoring_results(plan, probe=None, pci_gpus=0, inspect=None, pods=None, progress=None) -> list[dict]:
    """The section's results: [{section, check, status, detail}] in CHECKS order.

    ``plan``: dinops_monitoring_plan's; ``probe``: the registered exec of files/prometheus_probe.py; ``pci_gpus``:
    gpu_host's count; ``inspect``: the docker section's `docker inspect` stdout; ``pods``: the registered
    `kubectl get pods -l app.kubernetes.io/name=dinops-train` (the selector of the headless Service
    dinops-train-metrics); ``progress``: the registered read of the training container's progress.json (Docker)."""
    if not isinstance(plan, dict) or "runtime" not in plan:
        raise AnsibleFilterError(f"dinops_validate_monitoring_results needs the section's plan, got {plan!r}")
    if plan.get("error"):
        return [{"section": SECTION, "check": c, "status": "fail", "detail": plan["error"]} for c in CHECKS]
    if not plan["runtime"]:
        return [{"section": SECTION, "check": c, "status": "skip", "detail": plan["why_not"]} for c in CHECKS]
    report, why = _probe(probe or {})
    if why:
        return [{"section": SECTION, "check": c, "status": "fail", "detail": why} for c in CHECKS]
    try:
        training = _training(plan, inspect, pods, progress)
    except (AnsibleFilterError, AttributeError, TypeError) as exc:
        training = {"running": False, "detail": f"the training's state is not known ({exc})", "waiting": ""}
    try:
        gpus = int(str(pci_gpus or 0).strip())
    except ValueError as exc:
        raise AnsibleFilterError(f"the PCI GPU count is not a number: {pci_gpus!r}") from exc
    verdicts = {"prometheus_ready": _ready(report)}
    targets, why = _answer(report, "targets", "activeTargets", "GET /api/v1/targets")
    for check in JOBS:
        verdicts[check] = (
            {"status": "fail", "detail": why} if why else _job(check, targets, training, gpus, plan["runtime"])
        )
    alerts, why = _answer(report, "alerts", "alerts", "GET /api/v1/alerts")
    verdicts["alerts"] = {"status": "fail", "detail": why} if why else _alerts(alerts)
    return [{"section": SECTION, "check": c} | verdicts[c] for c in CHECKS]


class FilterModule:
    """Monitoring section filters."""

    def filters(self):
        return {
            "dinops_validate_monitoring_plan": dinops_monitoring_plan,
            "dinops_validate_monitoring_results": dinops_monitoring_results,
            "dinops_validate_monitoring_settled": dinops_monitoring_settled,
        }
