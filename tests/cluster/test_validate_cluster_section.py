"""The validator's cluster section: what each probed state reports (pass, fail or skip, never a false pass).

The probes need a cluster; the verdicts are a template over the probes' registered results, rendered here by
ansible-playbook for each state in one run.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from dinops_testing import load_plugin, run_playbook

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "roles" / "validate" / "templates" / "cluster_results.json.j2"


def node(name, ready=True, gpus=None):
    allocatable = {"cpu": "8"} | ({"nvidia.com/gpu": str(gpus)} if gpus is not None else {})
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": {"name": name}, "status": {"conditions": [condition], "allocatable": allocatable}}


def claim(name, phase="Bound"):
    return {"metadata": {"name": name}, "status": {"phase": phase}}


def gpu_pod(name, app, gpus=1, node_name="gpu-1", phase="Running", namespace="dinops", container="serve"):
    """A pod as `kubectl get pods -o json` lists it: the GPU as a limit (the request defaults to it)."""
    state = {"running": {"startedAt": "2026-11-23T20:00:00Z"}} if phase == "Running" else {"waiting": {"reason": "x"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": app}},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": container, "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "4"},
                                                             "requests": {"cpu": "1"}}}],
        },
        "status": {"phase": phase, "containerStatuses": [{"name": container, "state": state, "ready": True}]},
    }  # fmt: skip


SERVE_POD = gpu_pod("dinops-serve-7d9f-abcde", "dinops-serve")
H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.2}
CUDA_REPORT = {"torch": "2.9.0+cu130", "cuda": "13.0", "cuda_available": True, "error": None, "devices": [H100]}
WAITING_FACT = {
    "workloads": ["dinops-download", "dinops-serve", "dinops-client"],
    "serve": {"state": "waiting", "checkpoint": "/models/checkpoint.pth",
              "message": "inference is waiting for a model at /models/checkpoint.pth: set dinops_train: true ..."},
    "train": "not-applied",
}  # fmt: skip


def probes(*, pci=1, nodes=(), claims=(), daemon=None, gpu_pod=None, api=None, client=200, cluster="minikube"):
    daemon_text = json.dumps(
        daemon if daemon is not None else {"default-runtime": "nvidia", "runtimes": {"nvidia": {}}}
    )
    return {
        "dinops_cluster": cluster,
        "__validate_cluster_kubeconfig": "/etc/dinops/kubeconfig",
        "__validate_cluster_client_port": 30000,
        "__validate_cluster_client_base": "http://127.0.0.1",
        "__validate_cluster_gpu_replicas": 1,
        "__validate_pci_result": {"stdout": str(pci)},
        "__validate_cluster_kubeconfig_result": {"stat": {"exists": True}},
        "__validate_cluster_get_result": {
            "results": [
                {"rc": 0, "stdout": json.dumps({"items": list(nodes)}), "stderr": ""},
                {"rc": 0, "stdout": json.dumps({"items": list(claims)}), "stderr": ""},
            ]
        },
        "__validate_cluster_daemon_json_result": {"content": base64.b64encode(daemon_text.encode()).decode()},
        "__validate_cluster_gpu_pod_result": gpu_pod or {"rc": 0, "stdout_lines": ["NVIDIA H100 80GB HBM3", "ok"]},
        "__validate_cluster_api_result": {
            "rc": 0,
            "stdout_lines": [
                json.dumps(api or {"readyz": 200, "detect": 200, "keys": ["detections"], "detections": 0})
            ],
        },
        "__validate_cluster_client_result": {"status": client, "msg": "Connection refused" if client != 200 else "OK"},
    }


def held(pods, exec_result=None, **extra):
    """Every GPU held by ``pods``: the plan is computed by the role's filter inside the play, as the probes do."""
    state = probes(**HEALTHY, **extra)
    state["__validate_cluster_pods_result"] = {"rc": 0, "stdout": json.dumps({"items": pods})}
    state["__validate_cluster_gpu_plan"] = (
        "{{ __validate_cluster_get_result.results[0].stdout"
        " | dinops_gpu_probe_plan(__validate_cluster_pods_result.stdout) }}"
    )
    state["__validate_cluster_gpu_pod_result"] = {"skipped": True}
    if exec_result is not None:
        state["__validate_cluster_gpu_exec_result"] = exec_result
    return state


def with_fact(state, fact):
    return {
        **state,
        "__validate_cluster_workloads_result": {"content": base64.b64encode(json.dumps(fact).encode()).decode()},
    }


HEALTHY = {"nodes": [node("gpu-1", gpus=1)], "claims": [claim("dinops-dataset"), claim("dinops-output")]}
STATES = {
    "healthy-gpu": probes(**HEALTHY),
    "healthy-cpu": probes(pci=0, nodes=[node("cpu-1")], claims=HEALTHY["claims"], daemon={}),
    "no-cluster": {
        **probes(),
        "__validate_cluster_kubeconfig_result": {"stat": {"exists": False}},
    },
    "broken": probes(
        nodes=[node("gpu-1", ready=False, gpus=0)],
        claims=[claim("dinops-dataset"), claim("dinops-output", "Pending")],
        daemon={"exec-opts": ["native.cgroupdriver=systemd"]},
        gpu_pod={"rc": 1, "stdout_lines": [], "stderr": "timed out waiting for the pod to be running"},
        api={"error": "Connection refused"},
        client=-1,
    ),
    "gpu-held-by-serve": held([SERVE_POD], {"rc": 0, "stdout": json.dumps(CUDA_REPORT), "stderr": ""}),
    "gpu-held-cuda-broken": held(
        [SERVE_POD],
        {"rc": 3, "stdout": json.dumps({**CUDA_REPORT, "devices": [], "error": "torch.cuda.is_available() is False"})},
    ),
    "gpu-held-by-others": held([gpu_pod("trainer-0", "other", namespace="ml", container="main")]),
    "waiting-for-a-model": with_fact(
        probes(
            **HEALTHY,
            api={
                "readyz": 503,
                "detect": 503,
                "keys": ["detail"],
                "model": "waiting",
                "checkpoint": "/models/checkpoint.pth",
            },
        ),
        WAITING_FACT,
    ),
    "waiting-fact-but-now-serving": with_fact(probes(**HEALTHY), WAITING_FACT),
    "no-inference-deployed": with_fact(
        probes(**HEALTHY, api={"error": 'deployments.apps "dinops-client" not found'}, client=-1),
        {"workloads": ["dinops-download", "dinops-train"], "serve": {"state": "not-applied"}, "train": "started"},
    ),
    "k3s-ingress": {
        **probes(cluster="k3s", **HEALTHY),
        "__validate_cluster_client_port": 443,
        "__validate_cluster_client_base": "https://203.0.113.7",
    },
    "k3s-time-sliced": {
        **probes(cluster="k3s", nodes=[node("gpu-1", gpus=2)], claims=HEALTHY["claims"]),
        "__validate_cluster_gpu_replicas": 2,
    },
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("validate-cluster")
    tasks = [
        {
            "name": f"Render {name}",
            "vars": variables,
            "ansible.builtin.copy": {
                "content": "{{ lookup('ansible.builtin.template', '" + str(TEMPLATE) + "') }}",
                "dest": str(tmp / f"{name}.json"),
                "mode": "0644",
            },
        }
        for name, variables in STATES.items()
    ]
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": tasks}]
    run_playbook(tmp, play, config=f"filter_plugins = {REPO / 'roles' / 'validate' / 'filter_plugins'}\n")
    return {
        name: {r["check"]: (r["status"], r["detail"]) for r in json.loads((tmp / f"{name}.json").read_text())}
        for name in STATES
    }


CHECKS = [
    "node_ready",
    "gpu_allocatable",
    "gpu_pod",
    "daemon_json_nvidia",
    "pvcs_bound",
    "inference_ready",
    "detect_json",
    "client_nodeport",
]


def statuses(verdict):
    return [verdict[check][0] for check in CHECKS]


def test_behind_the_ingress_the_page_is_asked_over_https_on_443(verdicts):
    assert verdicts["k3s-ingress"]["client_nodeport"] == ("pass", "GET https://203.0.113.7:443/ answered 200")


@pytest.mark.parametrize(
    ("extra", "url"),
    [
        ({}, "http://127.0.0.1:30000"),
        ({"dinops_publish_address": "203.0.113.7"}, "https://203.0.113.7:30000"),
        ({"workloads_ingress": True, "dinops_publish_address": "203.0.113.7"}, "https://203.0.113.7:443"),
        (
            {"workloads_ingress": True, "ansible_facts": {"default_ipv4": {"address": "10.1.2.3"}}},
            "https://10.1.2.3:443",
        ),
    ],
)
def test_the_role_asks_the_client_where_it_is_published(tmp_path, extra, url):
    """The role's own defaults and vars: the NodePort on loopback or the published address; with the ingress (no
    NodePort, k8s/components/ingress) the node's 443 over HTTPS, at the host's address when the client is not
    published elsewhere."""
    role = REPO / "roles" / "validate"
    tasks = [
        {"ansible.builtin.include_vars": str(role / "defaults" / "main.yml")},
        {"ansible.builtin.include_vars": str(role / "vars" / "main.yml")},
        {
            "ansible.builtin.copy": {
                "content": "{{ __validate_cluster_client_base }}:{{ __validate_cluster_client_port }}",
                "dest": str(tmp_path / "url"),
                "mode": "0644",
            },
            "vars": {"__validate_cluster_nodeport": 30000},
        },
    ]
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "vars": extra, "tasks": tasks}]
    run_playbook(tmp_path, play, config=f"filter_plugins = {role / 'filter_plugins'}\n")
    assert (tmp_path / "url").read_text() == url


def test_a_healthy_gpu_cluster_passes_every_check(verdicts):
    assert statuses(verdicts["healthy-gpu"]) == ["pass"] * 8
    assert verdicts["healthy-gpu"]["gpu_allocatable"][1] == "nvidia.com/gpu allocatable 1, expected 1"


def test_a_cpu_host_skips_the_gpu_checks_and_passes_the_rest(verdicts):
    assert statuses(verdicts["healthy-cpu"]) == ["pass", "skip", "skip", "skip", "pass", "pass", "pass", "pass"]


def test_a_host_without_the_cluster_skips_everything(verdicts):
    verdict = verdicts["no-cluster"]
    assert statuses(verdict) == ["skip"] * 8
    assert verdict["node_ready"][1] == "no cluster on this host (/etc/dinops/kubeconfig missing)"


def test_every_broken_part_fails_with_what_was_seen(verdicts):
    verdict = verdicts["broken"]
    assert statuses(verdict) == ["fail"] * 8
    assert verdict["node_ready"][1] == "0 of 1 nodes Ready"
    assert verdict["gpu_allocatable"][1] == "nvidia.com/gpu allocatable 0, expected 1"
    assert verdict["gpu_pod"][1] == "timed out waiting for the pod to be running"
    assert verdict["daemon_json_nvidia"][1] == "daemon.json: default-runtime unset, runtimes none"
    assert verdict["pvcs_bound"][1] == "1 of 2 claims Bound: dinops-dataset"
    assert verdict["inference_ready"][1] == "GET dinops-serve:8000/readyz answered Connection refused"


def test_k3s_counts_time_sliced_gpus_and_leaves_daemon_json_alone(verdicts):
    verdict = verdicts["k3s-time-sliced"]
    assert verdict["gpu_allocatable"] == ("pass", "nvidia.com/gpu allocatable 2, expected 2")
    assert verdict["daemon_json_nvidia"][0] == "skip"


def test_a_gpu_held_by_serve_is_probed_inside_its_pod_not_asked_for_again(verdicts):
    status, detail = verdicts["gpu-held-by-serve"]["gpu_pod"]
    assert status == "pass"
    assert detail == (
        "CUDA computed in dinops/dinops-serve-7d9f-abcde (serve): cuda:0 NVIDIA H100 80GB HBM3 (torch 2.9.0+cu130, "
        "CUDA 13.0)"
    )


def test_cuda_broken_inside_the_serve_pod_fails(verdicts):
    status, detail = verdicts["gpu-held-cuda-broken"]["gpu_pod"]
    assert status == "fail"
    assert "torch.cuda.is_available() is False" in detail


def test_a_gpu_held_by_pods_it_cannot_enter_is_skipped_with_the_reason(verdicts):
    status, detail = verdicts["gpu-held-by-others"]["gpu_pod"]
    assert status == "skip"
    assert detail.startswith("every nvidia.com/gpu is held (ml/trainer-0)")


def test_inference_waiting_for_a_model_is_skipped_not_failed(verdicts):
    verdict = verdicts["waiting-for-a-model"]
    assert verdict["inference_ready"][0] == verdict["detect_json"][0] == "skip"
    assert verdict["inference_ready"][1].startswith("waiting for a model at /models/checkpoint.pth (inference is")
    assert verdict["client_nodeport"][0] == "pass"


def test_a_model_that_arrived_since_the_workloads_stage_is_checked_for_real(verdicts):
    assert statuses(verdicts["waiting-fact-but-now-serving"]) == ["pass"] * 8


def test_parts_the_profile_did_not_deploy_are_skipped(verdicts):
    verdict = verdicts["no-inference-deployed"]
    assert [verdict[c][0] for c in ("inference_ready", "detect_json", "client_nodeport")] == ["skip"] * 3
    assert verdict["inference_ready"][1] == "inference is not deployed on this host (the profile lists no inference)"


# --- The decisions themselves, on API-shaped nodes and pods ----------------------------------------------------

validate_cluster = load_plugin("roles/validate/filter_plugins/validate_cluster.py")


def test_the_plan_counts_requests_per_node_and_ignores_finished_pods():
    nodes = [node("gpu-1", gpus=1), node("gpu-2", gpus=1)]
    done = gpu_pod("old-job", "dinops-train", node_name="gpu-2", phase="Succeeded", container="train")
    plan = validate_cluster.dinops_gpu_probe_plan({"items": nodes}, {"items": [SERVE_POD, done]})
    assert (plan["mode"], plan["free"], plan["allocatable"]) == ("pod", 1, 2)


def test_the_plan_takes_the_larger_of_init_and_main_containers():
    pod = gpu_pod("dinops-train-x9k2l", "dinops-train", gpus=0, container="train")
    pod["spec"]["initContainers"] = [{"name": "wait", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    plan = validate_cluster.dinops_gpu_probe_plan([node("gpu-1", gpus=1)], [pod])
    assert plan["free"] == 0
    # Held only through an init container: no running container of it holds the GPU, nothing to exec into.
    assert plan["mode"] == "skip"


def test_the_plan_prefers_serve_and_falls_back_to_training():
    train = gpu_pod("dinops-train-x9k2l", "dinops-train", container="train")
    plan = validate_cluster.dinops_gpu_probe_plan([node("gpu-1", gpus=1)], [train])
    assert (plan["mode"], plan["pod"], plan["container"]) == ("exec", "dinops-train-x9k2l", "train")
    two = validate_cluster.dinops_gpu_probe_plan([node("gpu-1", gpus=2)], [train, SERVE_POD])
    assert (two["mode"], two["pod"]) == ("exec", "dinops-serve-7d9f-abcde")


def test_a_full_gpu_memory_is_a_skip_with_the_reason_and_no_gpu_is_a_skip():
    plan = {"mode": "exec", "namespace": "dinops", "pod": "dinops-train-x", "container": "train"}
    oom = {"rc": 1, "stdout": json.dumps({**CUDA_REPORT, "devices": [], "error": "RuntimeError: CUDA out of memory."})}
    assert validate_cluster.dinops_gpu_pod_verdict(plan, 1, exec_result=oom)["status"] == "skip"
    assert validate_cluster.dinops_gpu_pod_verdict(plan, 0)["status"] == "skip"
    # rc 0 without a device is no evidence
    empty = {"rc": 0, "stdout": json.dumps({**CUDA_REPORT, "devices": []})}
    assert validate_cluster.dinops_gpu_pod_verdict(plan, 1, exec_result=empty)["status"] == "fail"
