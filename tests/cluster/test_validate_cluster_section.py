"""The validator's cluster section: what each probed state reports (pass, fail or skip, never a false pass).

The probes need a cluster; the verdicts are a template over the probes' registered results, rendered here by
ansible-playbook for each state in one run.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from dinops_testing import run_playbook

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "roles" / "validate" / "templates" / "cluster_results.json.j2"


def node(name, ready=True, gpus=None):
    allocatable = {"cpu": "8"} | ({"nvidia.com/gpu": str(gpus)} if gpus is not None else {})
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": {"name": name}, "status": {"conditions": [condition], "allocatable": allocatable}}


def claim(name, phase="Bound"):
    return {"metadata": {"name": name}, "status": {"phase": phase}}


def probes(*, pci=1, nodes=(), claims=(), daemon=None, gpu_pod=None, api=None, client=200, cluster="minikube"):
    daemon_text = json.dumps(
        daemon if daemon is not None else {"default-runtime": "nvidia", "runtimes": {"nvidia": {}}}
    )
    return {
        "dinops_cluster": cluster,
        "__validate_cluster_kubeconfig": "/etc/dinops/kubeconfig",
        "__validate_cluster_nodeport": 30000,
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
    run_playbook(tmp, play)
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
