"""The validator's docker section (roles/validate/tasks/checks/workloads_docker.yml): what each state of the docker
runtime reports, pass, fail or skip, each with its line; never a pass on a host that does not run the runtime.

The decisions are read from real `docker inspect` objects and real probe output (tests/fixtures/docker_inspect/,
README there); the section file itself runs with ansible-playbook against this machine's Docker; the API probe runs
against a real `dinops serve` process.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest
from ansible.errors import AnsibleFilterError

from dinops_testing import REPO, load_plugin, run_playbook

docker = load_plugin("roles/validate/filter_plugins/validate_docker.py")
FIXTURES = REPO / "tests" / "fixtures" / "docker_inspect"
CHECKS = ["containers", "inference_ready", "detect_json", "client_port", "gpu_in_containers"]
ALL = ["dinops-download", "dinops-train", "dinops-serve", "dinops-client"]
H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.2}
CUDA_REPORT = {"torch": "2.9.0+cu130", "cuda": "13.0", "cuda_available": True, "error": None, "devices": [H100]}


def fixture(name: str):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def fact(**changes) -> str:
    """The fact file the workloads role writes for the docker runtime (its contract), as text."""
    value = {
        "runtime": "docker",
        "workloads": ALL,
        "serve": {"state": "serving", "message": "", "checkpoint": "/models/checkpoint.pth"},
        "train": "complete",
        "client_port": 30000,
        "gpus": 0,
    }
    return json.dumps(value | changes)


def api(name: str, **changes) -> dict:
    """The registered `docker exec dinops-serve python3 -c <probe>` of a captured probe line."""
    report = fixture(f"api_{name}") | changes
    return {"rc": 0, "stdout_lines": [json.dumps(report)], "stderr": ""}


CLIENT_OK = {
    "results": [
        {"validate_client_path": "/healthz", "status": 200, "content_type": "application/json", "msg": "OK"},
        {"validate_client_path": "/", "status": 200, "content_type": "text/html; charset=utf-8", "msg": "OK"},
    ]
}
HEALTHY = [fixture(n) for n in ("download_exited_0", "train_exited_1", "serve_healthy", "client_healthy")]
HEALTHY[1] = fixture("train_running")


def gpu_serve():
    """dinops-serve running and healthy with `--gpus all`: the captured running State with the captured
    DeviceRequests of `docker create --gpus all` (no GPU here to start one)."""
    serve = fixture("serve_healthy")
    serve["HostConfig"] = fixture("serve_gpus_all_created")["HostConfig"]
    return serve


def results(fact_text=None, inspect=(), **probes) -> dict:
    probes = {"api": api("ready"), "client": CLIENT_OK} | probes
    fact_text = fact() if fact_text is None else fact_text
    listed = docker.dinops_docker_results(fact_text, json.dumps(list(inspect)), fact_path="/f.fact", **probes)
    assert [r["check"] for r in listed] == CHECKS and {r["section"] for r in listed} == {"docker"}
    return {r["check"]: (r["status"], r["detail"]) for r in listed}


def statuses(verdict) -> list[str]:
    return [verdict[c][0] for c in CHECKS]


# --- Hosts that do not run the docker runtime: every check skipped, never passed ----------------------------------


@pytest.mark.parametrize(
    ("fact_text", "why"),
    [
        ("", "(/f.fact absent: the workloads stage has not run here)"),
        (json.dumps({"workloads": ALL}), "(the workloads stage recorded runtime kubernetes)"),
        (fact(runtime="kubernetes"), "(the workloads stage recorded runtime kubernetes)"),
    ],
)  # fmt: skip
def test_a_host_without_the_docker_runtime_skips_every_check(fact_text, why):
    verdict = results(fact_text, HEALTHY, pci_gpus=1)
    assert statuses(verdict) == ["skip"] * 5
    assert {detail for _, detail in verdict.values()} == {f"the docker runtime does not run on this host {why}"}


def test_a_fact_file_that_is_not_json_names_the_setting():
    with pytest.raises(AnsibleFilterError, match=r"/f.fact \(validate_docker_workloads_fact\) is not JSON"):
        docker.dinops_docker_results("{not json", "[]", fact_path="/f.fact")
    with pytest.raises(AnsibleFilterError, match="'workloads' is not a list of names"):
        docker.dinops_docker_results(fact(workloads="dinops-serve"), "[]")


# --- containers ---------------------------------------------------------------------------------------------------


def test_a_healthy_cpu_host_passes_and_skips_only_the_gpu():
    verdict = results(inspect=HEALTHY)
    assert statuses(verdict) == ["pass", "pass", "pass", "pass", "skip"]
    assert verdict["containers"][1] == (
        "dinops-download completed (exit code 0); dinops-train running; dinops-serve running, healthy; "
        "dinops-client running, healthy"
    )
    assert verdict["gpu_in_containers"] == ("skip", "no NVIDIA GPU on the PCI bus")


def test_a_job_that_failed_fails_with_its_exit_code_and_last_log_lines():
    inspect = [*HEALTHY[:1], fixture("train_exited_1"), *HEALTHY[2:]]
    plan = docker.dinops_docker_plan(fact(), json.dumps(inspect))
    assert plan["unwell"] == ["dinops-train"]
    logs = {"results": [fixture("logs_train_exited_1") | {"validate_container": "dinops-train"}]}
    status, detail = results(inspect=inspect, logs=logs)["containers"]
    assert status == "fail"
    # stdout and stderr merged back in time order
    assert (
        "dinops-train exited with code 1; last log lines: epoch 4 | epoch 5 | epoch 6 | epoch 7 | RuntimeError: CUDA"
        in detail
    )


@pytest.mark.parametrize(
    ("name", "fixture_name", "said"),
    [
        ("dinops-serve", "serve_starting", "dinops-serve still starting (health: starting)"),
        ("dinops-client", "client_unhealthy", "dinops-client unhealthy ("),
        ("dinops-serve", "serve_restarting", "dinops-serve restarting (last exit code 2, "),
        ("dinops-serve", "serve_gpus_all_created", "dinops-serve created"),
        ("dinops-download", None, "dinops-download missing (no such container)"),
    ],
)  # fmt: skip
def test_a_container_that_is_not_as_its_kind_needs_fails(name, fixture_name, said):
    inspect = [c for c in HEALTHY if c["Name"] != "/" + name] + ([fixture(fixture_name)] if fixture_name else [])
    assert [c["Name"] for c in inspect if c["Name"] == "/" + name] == (["/" + name] if fixture_name else [])
    status, detail = results(inspect=inspect)["containers"]
    assert status == "fail" and said in detail, detail


def test_a_deployment_without_a_healthcheck_fails_and_a_job_needs_none():
    serve = fixture("train_running")  # running, no Health
    serve["Name"], serve["Config"]["Labels"]["dinops.io/kind"] = "/dinops-serve", "Deployment"
    status, detail = results(inspect=[*HEALTHY[:2], serve, HEALTHY[3]])["containers"]
    assert status == "fail" and "dinops-serve running without a HEALTHCHECK" in detail


def test_no_container_applied_is_a_skip():
    assert results(fact(workloads=[]), [])["containers"][0] == "skip"


# --- inference_ready and detect_json ------------------------------------------------------------------------------


def test_a_ready_model_passes_and_its_detections_have_the_documented_shape():
    verdict = results(inspect=HEALTHY)
    assert verdict["inference_ready"] == ("pass", "model ready: /models/checkpoint.pth on cpu (gather backend)")
    assert verdict["detect_json"] == (
        "pass",
        "POST /v1/detect answered 200 with 3 detections of docs/api.md's shape on a 64x48 test PNG",
    )


def test_waiting_for_a_model_is_skipped_with_the_servers_message_and_the_stages_advice():
    advice = "inference waits for a model at /models/checkpoint.pth: set dinops_train: true"
    waiting = fact(
        serve={"state": "waiting", "message": advice, "checkpoint": "/models/checkpoint.pth"}, train="running"
    )
    verdict = results(waiting, HEALTHY, api=api("waiting"))
    assert verdict["inference_ready"] == (
        "skip",
        "waiting for a model: /models/checkpoint.pth does not exist yet; train, or give a checkpoint "
        f"({advice}); training: running",
    )
    assert verdict["detect_json"] == ("skip", "waiting for a model: nothing to detect with yet")


def test_a_loading_model_is_skipped():
    loading = fixture("api_waiting")
    loading["health"]["model"], loading["ready"] = "loading", {"status": "loading"}
    verdict = results(inspect=HEALTHY, api={"rc": 0, "stdout_lines": [json.dumps(loading)]})
    assert verdict["inference_ready"] == ("skip", "the model at /models/checkpoint.pth is still loading")
    assert verdict["detect_json"][0] == "skip"


def test_a_model_that_failed_to_load_fails_with_the_servers_error():
    verdict = results(inspect=HEALTHY, api=api("failed"))
    assert verdict["inference_ready"][0] == "fail"
    assert verdict["inference_ready"][1].startswith(
        "the model at /models/checkpoint.pth failed to load: checkpoint /models/checkpoint.pth cannot be used: "
        "PytorchStreamReader failed reading zip archive"
    )
    assert verdict["detect_json"] == ("skip", "not probed: the model failed to load")


def test_no_answer_from_inside_serve_fails():
    gone = {"rc": 1, "stdout_lines": [], "stderr": "Error response from daemon: No such container: dinops-serve"}
    verdict = results(inspect=HEALTHY, api=gone)
    assert verdict["inference_ready"] == (
        "fail",
        "docker exec dinops-serve failed (exit code 1): Error response from daemon: No such container: dinops-serve",
    )
    refused = results(
        inspect=HEALTHY, api=api("waiting", error="URLError: <urlopen error [Errno 111] Connection refused>")
    )
    assert refused["inference_ready"] == ("fail", "URLError: <urlopen error [Errno 111] Connection refused>")


def bad_answer(change) -> dict:
    report = fixture("api_ready")
    change(report)
    return {"rc": 0, "stdout_lines": [json.dumps(report)]}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: r["answer"].pop("detections"), "no detections list in"),
        (lambda r: r["answer"]["detections"][0].update(box=[1, 2, 3]), "a detection is not {box: [x1, y1, x2, y2]"),
        (lambda r: r["answer"]["detections"][1].update(score=1.5), "a detection is not"),
        (lambda r: r["answer"].update(width=800), "width and height 800x48, sent 64x48"),
        (lambda r: r.update(detect=401, answer={"error": "missing token", "code": "unauthorized"}),
         "POST /v1/detect answered 401: missing token"),
    ],
)  # fmt: skip
def test_a_detection_answer_not_of_the_documented_shape_fails(change, said):
    verdict = results(inspect=HEALTHY, api=bad_answer(change))
    assert verdict["inference_ready"][0] == "pass"
    assert verdict["detect_json"][0] == "fail" and said in verdict["detect_json"][1], verdict["detect_json"]


def test_a_profile_without_inference_or_client_skips_their_checks():
    verdict = results(fact(workloads=["dinops-download", "dinops-train"]), HEALTHY[:2])
    assert statuses(verdict) == ["pass", "skip", "skip", "skip", "skip"]
    assert (
        verdict["inference_ready"][1] == "inference is not deployed on this host (the fact file lists no dinops-serve)"
    )
    assert verdict["client_port"][1] == "the client is not deployed on this host (the fact file lists no dinops-client)"


# --- client_port --------------------------------------------------------------------------------------------------


def test_the_client_port_comes_from_the_setting_then_the_fact_file():
    assert docker.dinops_docker_plan(fact(client_port=30111), "[]")["client_port"] == 30111
    assert docker.dinops_docker_plan(fact(client_port=30111), "[]", client_port=31000)["client_port"] == 31000
    assert docker.dinops_docker_plan(fact(client_port=None), "[]")["client_port"] == 30000
    assert results(inspect=HEALTHY)["client_port"] == (
        "pass",
        "GET http://127.0.0.1:30000/healthz answered 200 and http://127.0.0.1:30000/ an HTML page",
    )


@pytest.mark.parametrize(
    ("publish", "base"),
    [
        ("127.0.0.1", "http://127.0.0.1"),
        ("127.0.1.1", "http://127.0.0.1"),
        ("0.0.0.0", "https://127.0.0.1"),
        ("203.0.113.7", "https://203.0.113.7"),
        ("2001:db8::7", "https://[2001:db8::7]"),
    ],
)  # fmt: skip
def test_a_public_client_is_asked_over_https_where_it_is_published(tmp_path, publish, base):
    """The role's own variables (vars/main.yml) from dinops_publish_address: a client published beyond loopback
    serves TLS with a login (docs/security.md), and one published on a single address is not on loopback."""
    out = tmp_path / "base.txt"
    role = REPO / "roles" / "validate"
    copy_base = {"ansible.builtin.copy": {"content": "{{ __validate_client_base }}", "dest": str(out)}}
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"dinops_publish_address": publish},
             "vars_files": [str(role / "defaults" / "main.yml"), str(role / "vars" / "main.yml")],
             "tasks": [copy_base]}]  # fmt: skip
    run_playbook(tmp_path, play, "localhost,", "")
    assert out.read_text().strip() == base
    assert results(inspect=HEALTHY, client_base=base)["client_port"][1].startswith(f"GET {base}:30000/healthz")


def test_a_client_that_does_not_answer_or_answers_no_page_fails():
    refused = "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>"
    down = {"results": [{"validate_client_path": p, "status": -1, "msg": refused} for p in ("/healthz", "/")]}
    status, detail = results(inspect=HEALTHY, client=down)["client_port"]
    assert status == "fail" and detail.startswith(f"GET http://127.0.0.1:30000/healthz answered nothing ({refused})")
    json_page = copy.deepcopy(CLIENT_OK)
    json_page["results"][1]["content_type"] = "application/json"
    assert results(inspect=HEALTHY, client=json_page)["client_port"] == (
        "fail",
        "GET http://127.0.0.1:30000/ answered 200 application/json, not an HTML page (OK)",
    )


# --- gpu_in_containers --------------------------------------------------------------------------------------------


def gpu_fact() -> str:
    return fact(gpus=1)


def test_a_gpu_given_to_serve_is_probed_inside_it():
    inspect = [*HEALTHY[:2], gpu_serve(), HEALTHY[3]]
    assert docker.dinops_docker_plan(gpu_fact(), json.dumps(inspect))["gpu_container"] == "dinops-serve"
    verdict = results(gpu_fact(), inspect, pci_gpus=1, gpu={"rc": 0, "stdout": json.dumps(CUDA_REPORT)})
    assert verdict["gpu_in_containers"] == (
        "pass",
        "CUDA computed in dinops-serve: cuda:0 NVIDIA H100 80GB HBM3 (torch 2.9.0+cu130, CUDA 13.0)",
    )


def test_training_is_probed_when_serve_holds_no_gpu_and_a_device_id_request_counts():
    train = fixture("train_running")
    train["HostConfig"] = fixture("train_gpu_device_0_created")["HostConfig"]
    plan = docker.dinops_docker_plan(gpu_fact(), json.dumps([HEALTHY[0], train, *HEALTHY[2:]]))
    assert (plan["gpu_requests"], plan["gpu_container"]) == (["dinops-train"], "dinops-train")


@pytest.mark.parametrize(
    ("pci", "fact_text", "inspect", "gpu", "expected"),
    [
        (0, fact(gpus=1), [gpu_serve()], None, ("skip", "no NVIDIA GPU on the PCI bus")),
        (1, fact(), HEALTHY, None, ("skip", "CPU host: the workloads stage gave the containers no GPU (gpus 0)")),
        (1, fact(gpus=1), HEALTHY, None,
         ("fail", "the fact file gives the containers 1 GPUs, but none of dinops-serve, dinops-train has a GPU device "
                  "request")),
        (1, fact(gpus=1, workloads=["dinops-serve"]), [fixture("serve_gpus_all_created")], None,
         ("skip", "dinops-serve has a GPU device request but does not run now: nothing to probe CUDA in")),
        (1, fact(gpus=1), [gpu_serve()],
         {"rc": 3, "stdout": json.dumps(CUDA_REPORT | {"devices": [], "error": "torch.cuda.is_available() is False"})},
         ("fail", "CUDA probe in dinops-serve failed: torch.cuda.is_available() is False")),
        (1, fact(gpus=1), [gpu_serve()],
         {"rc": 1, "stdout": json.dumps(CUDA_REPORT | {"devices": [], "error": "CUDA out of memory."})},
         ("skip", "GPU memory is full in dinops-serve, the probe cannot run there: CUDA out of memory.")),
        (1, fact(gpus=1), [gpu_serve()], {"rc": 0, "stdout": json.dumps(CUDA_REPORT | {"devices": []})},
         ("fail", "CUDA probe in dinops-serve failed: no output")),
    ],
)  # fmt: skip
def test_gpu_in_containers(pci, fact_text, inspect, gpu, expected):
    assert results(fact_text, inspect, pci_gpus=pci, gpu=gpu)["gpu_in_containers"] == expected


# --- The section file, run by ansible-playbook against this machine's Docker --------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_section_runs_against_this_machines_docker(tmp_path):
    """Three hosts of one play, each its own fact file: none, the Kubernetes runtime's, and the docker runtime's
    whose containers do not exist here. The last one probes the real daemon and fails what it cannot find."""
    names = subprocess.run(
        ["docker", "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True, check=False
    )
    if names.returncode != 0:
        pytest.skip(f"no Docker daemon answers here (`make docker` starts one): {names.stderr.strip()}")
    taken = sorted(set(names.stdout.split()) & set(ALL))
    if taken:
        pytest.skip(f"containers {taken} exist on this daemon (a workloads run): the missing-container case needs none")
    (tmp_path / "kubernetes.fact").write_text(json.dumps({"workloads": ALL, "serve": {"state": "serving"}}))
    (tmp_path / "docker.fact").write_text(fact(client_port=free_port(), gpus=1))
    inventory = tmp_path / "hosts.yml"
    hosts = {name: {"ansible_connection": "local"} for name in ("absent", "kubernetes", "docker")}
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "vars": {
                "__validate_results": [],
                "__validate_pci_result": {"stdout": "1"},
                "validate_docker_workloads_fact": str(tmp_path) + "/{{ inventory_hostname }}.fact",
            },
            "tasks": [
                {"ansible.builtin.include_role": {"name": "validate", "tasks_from": "checks/workloads_docker.yml"}},
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
    started = time.monotonic()
    run_playbook(tmp_path, play, inventory=str(inventory), config=f"roles_path = {REPO / 'roles'}\n")
    assert time.monotonic() - started < 240
    verdicts = {
        host: {r["check"]: (r["status"], r["detail"]) for r in json.loads((tmp_path / f"{host}.json").read_text())}
        for host in hosts
    }
    assert statuses(verdicts["absent"]) == statuses(verdicts["kubernetes"]) == ["skip"] * 5
    assert verdicts["kubernetes"]["containers"][1] == (
        "the docker runtime does not run on this host (the workloads stage recorded runtime kubernetes)"
    )
    real = verdicts["docker"]
    assert statuses(real) == ["fail", "fail", "skip", "fail", "fail"], real
    assert real["containers"][1] == "; ".join(f"{name} missing (no such container)" for name in ALL)
    assert real["inference_ready"][1].endswith("No such container: dinops-serve")
    assert real["gpu_in_containers"][1].startswith("the fact file gives the containers 1 GPUs, but none of")


# --- The API probe, against a real `dinops serve` -----------------------------------------------------------------

PROBE = REPO / "roles" / "validate" / "templates" / "docker_api_probe.py.j2"


def probe_source() -> str:
    """The template as the section sends it: its Jinja comment dropped, nothing else to render."""
    text = PROBE.read_text()
    assert "{{" not in text and "{%" not in text
    return text.split("-#}\n", 1)[1]


def test_the_probe_reads_a_real_server_waiting_then_ready(tmp_path):
    from dinops.serve.testing import running, write_small_checkpoint

    checkpoint = tmp_path / "checkpoint.pth"
    port = free_port()
    env = {
        "DINO_CHECKPOINT": str(checkpoint),
        "DINO_BIND": f"127.0.0.1:{port}",
        "DINO_WAIT_FOR_MODEL": "true",
        "DINO_MODEL_POLL_S": "0.2",
        "DINO_MIN_SIZE": "64",
        "DINO_MAX_SIZE": "96",
        "DINO_API_TOKEN": "s3cret",
    }

    def probe() -> dict:
        done = subprocess.run(
            [sys.executable, "-c", probe_source()],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=180,
            check=True,
        )
        return json.loads(done.stdout.splitlines()[-1])

    with running("serve", env, f"http://127.0.0.1:{port}", tmp_path / "serve.log", ready="/healthz"):
        waiting = probe()
        assert results(fact(), HEALTHY, api={"rc": 0, "stdout_lines": [json.dumps(waiting)]})["inference_ready"] == (
            "skip",
            f"waiting for a model: {checkpoint} does not exist yet; train, or give a checkpoint; training: complete",
        )
        write_small_checkpoint(tmp_path / ".new.pth")
        os.replace(tmp_path / ".new.pth", checkpoint)
        deadline = time.monotonic() + 120
        while (report := probe())["health"]["model"] != "ready":
            assert time.monotonic() < deadline, report
            time.sleep(0.5)
    assert report["detect"] == 200, report  # with the bearer token the server asks for
    verdict = results(fact(), HEALTHY, api={"rc": 0, "stdout_lines": [json.dumps(report)]})
    assert (verdict["inference_ready"][0], verdict["detect_json"][0]) == ("pass", "pass"), verdict
