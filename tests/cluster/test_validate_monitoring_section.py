"""The validator's monitoring section (roles/validate/tasks/checks/workloads_monitoring.yml): whether the deployment's
Prometheus is ready, scrapes the API, the trainer and the DCGM exporter, and which alerts fire.

Test data has the shape of Prometheus v2.42.0's HTTP API (docs/querying/api.md, "Targets" and "Alerts"); one test
runs the real /usr/bin/prometheus (Debian's 2.42 package) scraping a real metrics endpoint and a closed port, runs
the section's probe against it and feeds the probe's line to the filter; another runs the section file itself with
ansible-playbook against this machine's Docker and kubectl.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
import requests
import yaml
from ansible.errors import AnsibleFilterError

from dinops.serve.testing import free_port
from dinops.train.metrics import MetricsServer, TrainMetrics
from dinops_testing import REPO, load_plugin, run_playbook

monitoring = load_plugin("roles/validate/filter_plugins/validate_monitoring.py")
PROBE = REPO / "roles" / "validate" / "files" / "prometheus_probe.py"
CHECKS = ["prometheus_ready", "scrape_serve", "scrape_train", "scrape_dcgm", "alerts"]
DOCKER = {"runtime": "docker", "why_not": "", "error": "", "exec": ["docker", "exec", "dinops-prometheus"]}
KUBE = DOCKER | {"runtime": "kubernetes", "exec": ["kubectl", "exec"]}


def target(job: str, url: str, health: str = "up", error: str = "") -> dict:
    """One of data.activeTargets as GET /api/v1/targets answers it (v2.42.0 docs/querying/api.md, all its fields)."""
    return {
        "discoveredLabels": {"__address__": url.split("/")[2], "__metrics_path__": "/metrics", "__scheme__": "http",
                             "job": job},
        "labels": {"instance": url.split("/")[2], "job": job},
        "scrapePool": job,
        "scrapeUrl": url,
        "globalUrl": url,
        "lastError": error,
        "lastScrape": "2026-11-27T02:00:00.723715405Z",
        "lastScrapeDuration": 0.0507,
        "health": health,
        "scrapeInterval": "15s",
        "scrapeTimeout": "10s",
    }  # fmt: skip


def alert(name: str, severity: str, state: str = "firing") -> dict:
    """One of data.alerts as GET /api/v1/alerts answers it (v2.42.0 docs/querying/api.md)."""
    return {"activeAt": "2026-11-27T02:00:00Z", "annotations": {}, "labels": {"alertname": name, "severity": severity},
            "state": state, "value": "1e+00"}  # fmt: skip


SERVE = target("dinops-serve", "http://10.42.0.7:8000/metrics")
TRAIN = target("dinops-train", "http://10.42.0.9:9109/metrics")
DCGM = target("dcgm-exporter", "http://10.42.0.3:9400/metrics")
REFUSED = 'Get "http://10.42.0.9:9109/metrics": dial tcp 10.42.0.9:9109: connect: connection refused'


def probe(targets=(SERVE, TRAIN), alerts=(), ready=200, rc=0, **replace) -> dict:
    """The registered exec of the probe whose line holds these answers."""
    line = {
        "ready": {"status": ready, "body": "Prometheus Server is Ready." if ready == 200 else "Service Unavailable"},
        "targets": {"status": "success", "data": {"activeTargets": list(targets), "droppedTargets": []}},
        "alerts": {"status": "success", "data": {"alerts": list(alerts)}},
    } | replace
    return {"rc": rc, "stdout": json.dumps(line), "stdout_lines": [json.dumps(line)], "stderr": ""}


def results(plan=DOCKER, result=None, **kwargs) -> dict:
    got = monitoring.dinops_monitoring_results(plan, probe() if result is None else result, **kwargs)
    assert [r["check"] for r in got] == CHECKS and {r["section"] for r in got} == {"monitoring"}
    return {r["check"]: (r["status"], r["detail"]) for r in got}


def statuses(verdicts: dict) -> list[str]:
    return [verdicts[c][0] for c in CHECKS]


def inspect_train(status: str, code: int = 0) -> str:
    """`docker inspect dinops-train` (Docker Engine API v1.41 ContainerInspect: Name, State.Status, State.ExitCode)."""
    return json.dumps([{"Name": "/dinops-train", "State": {"Status": status, "ExitCode": code}}])


# --- The plan ------------------------------------------------------------------------------------------------------


def test_the_docker_runtime_with_prometheus_is_entered_with_docker_exec():
    plan = monitoring.dinops_monitoring_plan({"docker": True, "workloads": ["dinops-serve", "dinops-prometheus"]})
    assert plan == DOCKER


def test_the_docker_runtime_without_prometheus_skips_as_monitoring_off():
    plan = monitoring.dinops_monitoring_plan({"docker": True, "workloads": ["dinops-serve"]}, kubeconfig_exists=True)
    assert plan["runtime"] == "" and plan["why_not"].startswith("monitoring is off: the workloads stage applied no")
    assert statuses(results(plan)) == ["skip"] * 5


def test_a_host_with_neither_runtime_skips():
    plan = monitoring.dinops_monitoring_plan({"docker": False}, kubeconfig_exists=False)
    assert plan["runtime"] == "" and "neither the docker runtime nor a cluster's kubeconfig" in plan["why_not"]


def test_a_cluster_with_the_deployment_is_entered_with_kubectl_exec():
    plan = monitoring.dinops_monitoring_plan({"docker": False}, True, {"rc": 0, "stdout": "deployment.apps/x"},
                                             "/usr/local/bin/kubectl", "/etc/dinops/kubeconfig")  # fmt: skip
    assert plan["runtime"] == "kubernetes"
    assert plan["exec"] == ["/usr/local/bin/kubectl", "--kubeconfig=/etc/dinops/kubeconfig", "--namespace=dinops",
                            "exec", "deploy/dinops-prometheus", "--container=prometheus", "--"]  # fmt: skip


def test_a_cluster_without_the_deployment_skips_and_a_cluster_that_does_not_answer_fails():
    missing = {"rc": 1, "stderr": 'Error from server (NotFound): deployments.apps "dinops-prometheus" not found'}
    plan = monitoring.dinops_monitoring_plan({}, True, missing)
    assert plan["why_not"] == "monitoring is off: no Deployment dinops-prometheus in namespace dinops"
    refused = {"rc": 1, "stderr": "The connection to the server 127.0.0.1:6443 was refused"}
    plan = monitoring.dinops_monitoring_plan({}, True, refused)
    verdicts = results(plan)
    assert statuses(verdicts) == ["fail"] * 5
    assert verdicts["alerts"][1].endswith("failed: The connection to the server 127.0.0.1:6443 was refused")


# --- The probe's answer --------------------------------------------------------------------------------------------


def test_all_up_passes_each_job_and_names_its_targets():
    verdicts = results(result=probe((SERVE, TRAIN, DCGM)), pci_gpus="1")
    assert statuses(verdicts) == ["pass"] * 5
    assert verdicts["prometheus_ready"][1] == "GET /-/ready answered 200: Prometheus Server is Ready."
    assert verdicts["scrape_serve"][1] == "job dinops-serve: 1 target(s) up: http://10.42.0.7:8000/metrics"
    assert verdicts["alerts"][1] == "no alert firing"


def test_a_down_target_fails_with_its_url_and_prometheus_last_error():
    down = target("dinops-train", "http://10.42.0.9:9109/metrics", "down", REFUSED)
    verdicts = results(result=probe((SERVE, down)))
    assert verdicts["scrape_train"] == ("fail", f"job dinops-train: http://10.42.0.9:9109/metrics is down: {REFUSED}")
    assert verdicts["scrape_serve"][0] == "pass"


def test_a_target_not_scraped_yet_is_a_skip_that_says_so():
    fresh = target("dinops-serve", "http://10.42.0.7:8000/metrics", "unknown")
    status, detail = results(result=probe((fresh,)))["scrape_serve"]
    assert status == "skip" and "not scraped yet (health unknown" in detail


def test_no_serve_target_fails_nothing_scrapes_the_api():
    status, detail = results(result=probe((TRAIN,)))["scrape_serve"]
    assert status == "fail" and "nothing scrapes the API" in detail


def test_no_train_target_is_a_skip_when_training_does_not_run_and_a_fail_when_it_does():
    finished = results(result=probe((SERVE,)), inspect=inspect_train("exited", 0))["scrape_train"]
    assert finished == ("skip", "job dinops-train has no active target and no training runs: dinops-train is exited "
                        "(exit code 0)")  # fmt: skip
    running = results(result=probe((SERVE,)), inspect=inspect_train("running"))["scrape_train"]
    assert running[0] == "fail" and "while dinops-train is running" in running[1]
    none = results(result=probe((SERVE,)), inspect="[]")["scrape_train"]
    assert none == ("skip", "job dinops-train has no active target and no training runs: no dinops-train container "
                    "on this host")  # fmt: skip


def test_training_pods_on_kubernetes_decide_the_same_way():
    def pods(*states):
        items = [{"metadata": {"name": f"dinops-train-{i}"}, "status": {"phase": phase, "containerStatuses": [
            {"name": "train", "state": {state: {}}}]}} for i, (phase, state) in enumerate(states)]  # fmt: skip
        return {"rc": 0, "stdout": json.dumps({"items": items})}

    gating = results(KUBE, probe((SERVE,)), pods=pods(("Pending", "waiting")))["scrape_train"]
    assert gating == ("skip", "job dinops-train has no active target and no training runs: training pods: "
                      "dinops-train-0 Pending (none has a running container)")  # fmt: skip
    running = results(KUBE, probe((SERVE,)), pods=pods(("Succeeded", "terminated"), ("Running", "running")))
    status, detail = running["scrape_train"]
    assert status == "fail" and "training pod dinops-train-1 is running" in detail
    gone = results(KUBE, probe((SERVE,)), pods={"rc": 0, "stdout": '{"items": []}'})["scrape_train"]
    assert gone[0] == "skip" and "no training pod" in gone[1]


def test_a_down_train_target_while_the_data_gate_waits_is_a_skip_with_its_reason():
    down = target("dinops-train", "http://dinops-train-metrics:9109/metrics", "down", REFUSED)
    reason = "waiting for the dataset's download to complete: /data/coco/.dinops-complete.json is not there yet"
    waiting = {"rc": 0, "stdout": json.dumps({"state": "waiting_for_data", "reason": reason})}
    gating = results(result=probe((SERVE, down)), inspect=inspect_train("running"), progress=waiting)
    status, detail = gating["scrape_train"]
    assert status == "skip" and detail.endswith(f"training waits for its dataset, before the trainer serves metrics: "
                                                f"{reason}")  # fmt: skip
    training = {"rc": 0, "stdout": json.dumps({"state": "training", "global_step": 40})}
    trained = results(result=probe((SERVE, down)), inspect=inspect_train("running"), progress=training)
    assert trained["scrape_train"][0] == "fail"


def test_dcgm_is_required_on_gpu_hosts_only():
    gpu = results(plan=KUBE, result=probe((SERVE,)), pods={"rc": 0, "stdout": '{"items": []}'},
                  pci_gpus="2")["scrape_dcgm"]  # fmt: skip
    assert gpu[0] == "fail" and "on a host with 2 NVIDIA GPU(s)" in gpu[1]
    cpu = results(plan=KUBE, result=probe((SERVE,)), pods={"rc": 0, "stdout": '{"items": []}'},
                  pci_gpus="0")["scrape_dcgm"]  # fmt: skip
    assert cpu == ("skip", "job dcgm-exporter has no active target: no NVIDIA GPU on the PCI bus, no DCGM exporter "
                   "expected")  # fmt: skip
    with pytest.raises(AnsibleFilterError, match="PCI GPU count is not a number"):
        results(pci_gpus="two")


def test_the_docker_runtime_runs_no_dcgm_exporter_even_on_a_gpu_host():
    verdict = results(result=probe((SERVE,)), pci_gpus="1")["scrape_dcgm"]
    assert verdict[0] == "skip" and "the Docker runtime runs no DCGM exporter" in verdict[1]


def test_a_run_on_several_nodes_passes_with_process_0_up_and_the_other_pods_down():
    other = target("dinops-train", "http://10.42.1.4:9109/metrics", "down", REFUSED.replace("10.42.0.9", "10.42.1.4"))
    status, detail = results(result=probe((SERVE, TRAIN, other)))["scrape_train"]
    assert status == "pass" and "1 target(s) up (http://10.42.0.9:9109/metrics)" in detail
    assert "only process 0 does" in detail and "10.42.1.4:9109: connect: connection refused" in detail
    alone = target("dinops-train", "http://10.42.0.9:9109/metrics", "down", REFUSED)
    assert results(result=probe((SERVE, alone)))["scrape_train"][0] == "fail"


def _line_with(**answers) -> dict:
    line = json.loads(probe()["stdout"]) | answers
    return {"rc": 0, "stdout": json.dumps(line), "stdout_lines": [json.dumps(line)], "stderr": ""}


@pytest.mark.parametrize(
    ("result", "settled"),
    [
        (probe(), True),
        (probe((SERVE, target("dinops-train", "http://10.42.0.9:9109/metrics", "down", REFUSED))), False),
        (probe((SERVE, target("dinops-train", "http://10.42.0.9:9109/metrics", "unknown"))), False),
        (probe(ready=503), False),
        # Nothing to wait for: asking again would give the same answer.
        (probe(rc=1), True),
        ({"rc": 0, "stdout": "not json", "stdout_lines": ["not json"]}, True),
        ({}, True),
        (_line_with(targets={"status": "error", "error": "bad"}), True),
    ],
)
def test_the_probe_is_asked_again_only_while_prometheus_or_a_target_is_still_coming_up(result, settled):
    assert monitoring.dinops_monitoring_settled(result) is settled


def test_prometheus_not_ready_fails_with_its_answer():
    assert results(result=probe(ready=503))["prometheus_ready"] == (
        "fail",
        "GET /-/ready answered 503: Service Unavailable (still starting: replaying its write-ahead log, or stuck)",
    )
    line = probe(ready=None)
    line["stdout_lines"] = [line["stdout"].replace('"body": "Service Unavailable"', '"body": "connection refused"')]
    status, detail = results(result=line)["prometheus_ready"]
    assert status == "fail" and detail.endswith("in its container: connection refused")


def test_critical_alerts_fail_other_firing_alerts_pass_with_their_names_pending_ones_are_counted():
    warn = alert("DinopsDataLoaderStarving", "warning")
    crit = alert("DinopsTrainingStalled", "critical")
    pending = alert("DinopsDiskFilling", "warning", "pending")
    assert results(result=probe(alerts=[warn, pending]))["alerts"] == (
        "pass",
        "firing (warnings about the run, not the deployment): DinopsDataLoaderStarving (warning); 1 pending",
    )
    assert results(result=probe(alerts=[warn, crit]))["alerts"] == (
        "fail",
        "critical alerts firing: DinopsTrainingStalled (critical); also firing: DinopsDataLoaderStarving (warning)",
    )
    assert results(result=probe(alerts=[alert("DinopsTrainingStalled", "critical", "pending")]))["alerts"] == (
        "pass",
        "no alert firing; 1 pending",
    )


@pytest.mark.parametrize(
    ("result", "words"),
    [
        ({"rc": 1, "stdout": "", "stderr": "Error response from daemon: No such container: dinops-prometheus"},
         "the Prometheus probe exited with code 1: Error response from daemon: No such container: dinops-prometheus"),
        ({"rc": 126, "stdout": "", "stderr": 'exec: "python3": executable file not found in $PATH'},
         'exited with code 126: exec: "python3": executable file not found'),
        ({"rc": 0, "stdout": "<html>", "stderr": ""}, "the Prometheus probe printed no JSON line: '<html>'"),
        ({"rc": 0, "stdout": "", "stderr": ""}, "the Prometheus probe printed no JSON line"),
        ({"rc": 0, "stdout": "[1]", "stderr": ""}, "the Prometheus probe printed list, not a JSON object"),
        ({}, "the Prometheus probe did not run"),
    ],
)  # fmt: skip
def test_a_probe_without_a_usable_line_fails_every_check_with_why(result, words):
    verdicts = results(result=result)
    assert statuses(verdicts) == ["fail"] * 5
    assert all(words in verdicts[c][1] for c in CHECKS), verdicts


@pytest.mark.parametrize(
    ("targets", "words"),
    [
        ({"status": "error", "errorType": "internal", "error": "boom"}, "GET /api/v1/targets answered 'error': boom"),
        ({"status": "success", "data": {"activeTargets": "none"}}, "has no list data.activeTargets"),
        ({"status": "success", "data": None}, "has no list data.activeTargets"),
        ("garbage", "the probe has no answer of GET /api/v1/targets"),
    ],
)
def test_a_targets_answer_that_is_not_the_apis_shape_fails_the_scrape_checks(targets, words):
    verdicts = results(result=probe(targets=()) | {"stdout_lines": [json.dumps(
        json.loads(probe()["stdout"]) | {"targets": targets})]})  # fmt: skip
    assert [verdicts[c][0] for c in ("scrape_serve", "scrape_train", "scrape_dcgm")] == ["fail"] * 3
    assert words in verdicts["scrape_serve"][1]
    assert verdicts["prometheus_ready"][0] == verdicts["alerts"][0] == "pass"


def test_an_alerts_answer_that_is_not_the_apis_shape_fails_the_alerts_check():
    line = json.loads(probe()["stdout"]) | {"alerts": {"status": "success", "data": {"alerts": [1, 2]}}}
    status, detail = results(result={"rc": 0, "stdout_lines": [json.dumps(line)]})["alerts"]
    assert status == "fail" and "has no list data.alerts" in detail


def test_a_plan_that_is_not_one_stops_the_run():
    with pytest.raises(AnsibleFilterError, match="needs the section's plan"):
        monitoring.dinops_monitoring_results("docker")


# --- The real Prometheus -------------------------------------------------------------------------------------------


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"this test needs Debian's {name}: apt-get install -y prometheus (scripts/system-packages.sh)")
    return path


def _run_probe(base: str) -> dict:
    """files/prometheus_probe.py as the section runs it (python3 -c <text>), given the test server's base URL."""
    done = subprocess.run([sys.executable, "-c", PROBE.read_text(), base], capture_output=True, text=True, timeout=60)
    return {"rc": done.returncode, "stdout": done.stdout, "stdout_lines": done.stdout.splitlines(),
            "stderr": done.stderr}  # fmt: skip


def test_the_real_prometheus_answer_passes_the_up_target_and_fails_the_closed_port(tmp_path):
    """Prometheus 2.42 scraping a real metrics endpoint (job dinops-serve) and a port nothing listens on (job
    dinops-train) every second; once both were scraped, the probe's line and the raw API answer give the verdicts."""
    server = MetricsServer(TrainMetrics(tmp_path), 0, "127.0.0.1")
    closed = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "dinops-serve", "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}]},
            {"job_name": "dinops-train", "static_configs": [{"targets": [f"127.0.0.1:{closed}"]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "prometheus.log", "wb") as log:
        process = subprocess.Popen(
            [_binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline, answer = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            try:
                answer = requests.get(f"{base}/api/v1/targets", timeout=5).json()
                healths = {t["labels"]["job"]: t["health"] for t in answer["data"]["activeTargets"]}
                if healths == {"dinops-serve": "up", "dinops-train": "down"}:
                    break
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"Prometheus never scraped both targets: {answer}\n{(tmp_path / 'prometheus.log').read_text()}")
        line = _run_probe(base)
        assert line["rc"] == 0, line["stderr"]
        # Only the fields the filter reads leave the container.
        (serve,) = [t for t in json.loads(line["stdout"])["targets"]["data"]["activeTargets"]
                    if t["labels"]["job"] == "dinops-serve"]  # fmt: skip
        assert set(serve) == {"labels", "scrapeUrl", "health", "lastError"} and serve["labels"].keys() == {"job"}
        raw = {"rc": 0, "stdout_lines": [json.dumps(json.loads(line["stdout"]) | {"targets": answer})]}
        for result in (line, raw):
            verdicts = results(result=result, inspect="[]")
            assert statuses(verdicts) == ["pass", "pass", "fail", "skip", "pass"], verdicts
            assert verdicts["prometheus_ready"][1] == "GET /-/ready answered 200: Prometheus Server is Ready."
            up = f"http://127.0.0.1:{server.port}/metrics"
            assert verdicts["scrape_serve"][1] == f"job dinops-serve: 1 target(s) up: {up}"
            status, detail = verdicts["scrape_train"]
            assert detail.startswith(f"job dinops-train: http://127.0.0.1:{closed}/metrics is down: Get ")
            assert detail.endswith("connect: connection refused"), detail
    finally:
        process.terminate()
        process.wait(timeout=30)
        server.close()
    stopped = results(result=_run_probe(base))
    assert stopped["prometheus_ready"][0] == "fail" and "Connection refused" in stopped["prometheus_ready"][1]
    assert stopped["scrape_serve"][0] == "fail" and "GET /api/v1/targets answered 'error'" in stopped["scrape_serve"][1]


# --- The section file ----------------------------------------------------------------------------------------------


def test_the_section_runs_against_this_machines_docker_and_kubectl(tmp_path):
    """Four hosts of one play: neither runtime; the docker runtime without Prometheus; the docker runtime with it but
    no such container on this daemon; a cluster whose API server does not answer (the real kubectl, a kubeconfig that
    points at a closed port)."""
    names = subprocess.run(["docker", "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True,
                           check=False)  # fmt: skip
    if names.returncode != 0:
        pytest.skip(f"no Docker daemon answers here (`make docker` starts one): {names.stderr.strip()}")
    if "dinops-prometheus" in names.stdout.split():
        pytest.skip("a dinops-prometheus container exists on this daemon: the missing-container case needs none")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed here")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}],
    }))  # fmt: skip
    no_docker = {"docker": False, "workloads": []}
    found = "__validate_cluster_kubeconfig_result"
    hosts = {
        "absent": {"__validate_docker_plan": no_docker},
        "docker-off": {"__validate_docker_plan": {"docker": True, "workloads": ["dinops-serve"]}},
        "docker-on": {"__validate_docker_plan": {"docker": True, "workloads": ["dinops-serve", "dinops-prometheus"]}},
        "cluster": {"__validate_docker_plan": no_docker, found: {"stat": {"exists": True}}},
    }
    for variables in hosts.values():
        variables.setdefault(found, {"stat": {"exists": False}})
        variables["ansible_connection"] = "local"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "vars": {
                "__validate_results": [],
                "__validate_pci_result": {"stdout": "0"},
                "__validate_cluster_kubectl": kubectl,
                "__validate_cluster_kubeconfig": str(kubeconfig),
            },
            "tasks": [
                {"ansible.builtin.include_role": {"name": "validate", "tasks_from": "checks/workloads_monitoring.yml"}},
                {
                    "ansible.builtin.copy": {
                        "content": "{{ __validate_results | to_json }}",
                        "dest": str(tmp_path) + "/{{ inventory_hostname }}.json",
                        "mode": "0644",
                    }
                },
            ],
        }
    ]
    run_playbook(tmp_path, play, inventory=str(inventory), config=f"roles_path = {REPO / 'roles'}\n")
    verdicts = {
        host: {r["check"]: (r["status"], r["detail"]) for r in json.loads((tmp_path / f"{host}.json").read_text())}
        for host in hosts
    }
    assert statuses(verdicts["absent"]) == ["skip"] * 5
    assert statuses(verdicts["docker-off"]) == ["skip"] * 5
    assert verdicts["docker-off"]["alerts"][1].startswith("monitoring is off: the workloads stage applied no")
    assert statuses(verdicts["docker-on"]) == ["fail"] * 5
    assert verdicts["docker-on"]["prometheus_ready"][1].endswith("No such container: dinops-prometheus")
    assert statuses(verdicts["cluster"]) == ["fail"] * 5
    assert "kubectl get deployment dinops-prometheus --namespace=dinops failed: " in verdicts["cluster"]["alerts"][1]
