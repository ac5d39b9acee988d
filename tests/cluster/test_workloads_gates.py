"""The workloads role's gates and waits (roles/workloads/filter_plugins/rollout.py) fed the objects the API returns.

Shapes follow the Kubernetes v1.33 API reference: DeploymentStatus
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/deployment-v1/#DeploymentStatus), JobStatus
conditions (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/#JobStatus), PodStatus
conditions and ContainerStatus states
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus), as `kubectl get
deployments,pods -o json` prints them (a List). The end of the file runs the role's wait.yml against a kubectl that
prints such canned answers.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from dinops_testing import ansible_playbook, load_plugin

REPO = Path(__file__).resolve().parents[2]
rollout = load_plugin("roles/workloads/filter_plugins/rollout.py")
NOW = "2026-11-23T20:10:00Z"


def deployment(name="dinops-serve", generation=2, observed=2, replicas=1, updated=1, available=1, total=1, **extra):
    status = {"observedGeneration": observed, "replicas": total, "updatedReplicas": updated}
    if available:
        status["availableReplicas"] = available
        status["readyReplicas"] = available
    if total - available > 0:
        status["unavailableReplicas"] = total - available
    status["conditions"] = extra.pop(
        "conditions",
        [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
             "lastTransitionTime": "2026-11-23T20:00:00Z"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
             "lastTransitionTime": "2026-11-23T20:00:00Z"},
        ],
    )  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "dinops", "generation": generation},
        "spec": {"replicas": replicas, "strategy": {"type": "Recreate"}},
        "status": status,
    }


def pod(name="dinops-serve-7d9f-abcde", phase="Pending", containers=(), init=(), conditions=(), **metadata):
    status = {"phase": phase, "conditions": list(conditions)}
    if containers:
        status["containerStatuses"] = list(containers)
    if init:
        status["initContainerStatuses"] = list(init)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "dinops", **metadata},
        "status": status,
    }


def waiting(name, reason, message="", image="dinops-serve:0.1.0-abc", restarts=0, last=None):
    container = {
        "name": name,
        "image": image,
        "ready": False,
        "restartCount": restarts,
        "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}},
    }
    if last:
        container["lastState"] = {"terminated": last}
    return container


def running(name, image="dinops-train:0.1.0-abc"):
    return {"name": name, "image": image, "ready": True, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-11-23T20:05:00Z"}}}  # fmt: skip


def terminated(name, code=0, reason="Completed"):
    return {"name": name, "image": "dinops-train:0.1.0-abc", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}}}  # fmt: skip


def unschedulable(since="2026-11-23T20:00:00Z", message="0/1 nodes are available: 1 Insufficient cpu."):
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastTransitionTime": since}  # fmt: skip


def kubectl_list(*items):
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items), "metadata": {"resourceVersion": ""}})


def job(name="dinops-train", conditions=(), active=0):
    status = {"conditions": list(conditions)} if conditions else {}
    if active:
        status["active"] = active
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "dinops", "annotations": {"dinops.io/template-sha256": "a" * 64}},
            "spec": {"template": {}}, "status": status}  # fmt: skip


FAILED_BY_POLICY = [
    {"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy",
     "message": "Container train for pod dinops/dinops-train-x9k2l failed with exit code 2 matching FailJob rule at "
                "index 0"},
    {"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
     "message": "Container train for pod dinops/dinops-train-x9k2l failed with exit code 2 matching FailJob rule at "
                "index 0"},
]  # fmt: skip


# --- Deployments: deployment_ready semantics ------------------------------------------------------------------


def test_a_rolled_out_deployment_is_ready():
    state = rollout.rollout_state(kubectl_list(deployment(), pod(phase="Running", containers=[running("serve")])))
    assert state == {"state": "ready", "message": "Deployment dinops-serve rolled out (1 available)"}


def test_an_update_not_yet_observed_is_progressing_although_available_is_true():
    # Right after an apply the old ReplicaSet still holds Available=True: the generation tells.
    state = rollout.rollout_state(deployment(generation=3, observed=2))
    assert state["state"] == "progressing"
    assert "generation 2 of 3 observed" in state["message"]


def test_old_replicas_left_or_new_ones_unavailable_are_progressing():
    assert rollout.rollout_state(deployment(updated=0))["state"] == "progressing"
    assert rollout.rollout_state(deployment(total=2, updated=1, available=1))["state"] == "progressing"
    assert rollout.rollout_state(deployment(available=0))["state"] == "progressing"


def test_a_missing_deployment_and_a_failed_kubectl_call():
    assert rollout.rollout_state(kubectl_list())["state"] == "missing"
    failed = {"rc": 1, "stdout": "", "stderr": "The connection to the server 127.0.0.1:8443 was refused"}
    assert rollout.rollout_state(failed) == {
        "state": "unknown",
        "message": "kubectl failed (exit 1): The connection to the server 127.0.0.1:8443 was refused",
    }


def test_an_image_that_is_not_in_the_cluster_fails_at_once_with_the_image_and_the_hint():
    stuck = pod(containers=[waiting("serve", "ImagePullBackOff", 'Back-off pulling image "dinops-serve:0.1.0-abc"')])
    state = rollout.rollout_state(deployment(available=0), [stuck])
    assert state["state"] == "failed"
    assert "cannot get image dinops-serve:0.1.0-abc (ImagePullBackOff" in state["message"]
    assert "images_load must match the cluster" in state["message"]
    err = pod(containers=[waiting("serve", "ErrImagePull", "pull access denied")])
    assert rollout.rollout_state(kubectl_list(deployment(available=0), err))["state"] == "failed"


def test_a_crash_loop_fails_with_the_last_termination_message():
    crashing = pod(
        phase="Running",
        containers=[
            waiting("serve", "CrashLoopBackOff", "back-off 40s restarting failed container", restarts=3,
                    last={"exitCode": 2, "reason": "Error", "message": "DINO_CHECKPOINT: no such file"})
        ],
    )  # fmt: skip
    state = rollout.rollout_state(deployment(available=0), [crashing])
    assert state["state"] == "failed"
    assert (
        "keeps crashing (CrashLoopBackOff, 3 restarts, last exit 2 Error): DINO_CHECKPOINT: no such file"
        in (state["message"])
    )


def test_unschedulable_fails_with_the_schedulers_message_after_the_grace():
    pending = pod(conditions=[unschedulable(since="2026-11-23T20:08:00Z")])
    state = rollout.rollout_state(deployment(available=0), [pending], now=NOW)
    assert state["state"] == "failed"
    assert "cannot be scheduled: 0/1 nodes are available: 1 Insufficient cpu." in state["message"]
    # Within the grace another pod may still be releasing its GPU: not yet a failure.
    fresh = pod(conditions=[unschedulable(since="2026-11-23T20:09:30Z")])
    assert rollout.rollout_state(deployment(available=0), [fresh], now=NOW)["state"] == "progressing"


def test_a_terminating_pod_blocks_nothing_and_a_deadline_exceeded_fails():
    leaving = pod(containers=[waiting("serve", "CrashLoopBackOff")], deletionTimestamp="2026-11-23T20:09:00Z")
    assert rollout.rollout_state(deployment(available=0), [leaving])["state"] == "progressing"
    stalled = deployment(
        available=0,
        conditions=[{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                     "message": 'ReplicaSet "dinops-serve-7d9f" has timed out progressing.'}],
    )  # fmt: skip
    assert rollout.rollout_state(stalled) == {
        "state": "failed",
        "message": 'Deployment dinops-serve: ReplicaSet "dinops-serve-7d9f" has timed out progressing.',
    }


# --- Jobs: failed at once, blocked, past the dataset gate ------------------------------------------------------


def test_a_failed_job_is_reported_with_kubernetes_reason():
    state = rollout.job_progress(kubectl_list(job(conditions=FAILED_BY_POLICY)))
    assert state["state"] == "failed"
    assert state["message"].startswith("Job dinops-train failed (PodFailurePolicy): Container train for pod")


def test_training_held_at_its_init_container_is_waiting_then_started():
    gate = pod(
        "dinops-train-x9k2l",
        containers=[waiting("train", "PodInitializing")],
        init=[running("wait-for-dataset")],
    )
    state = rollout.job_progress(kubectl_list(job(active=1), gate))
    assert state["state"] == "waiting"
    assert "container wait-for-dataset running" in state["message"]
    past = pod("dinops-train-x9k2l", "Running", [running("train")], [terminated("wait-for-dataset")])
    assert rollout.job_progress(kubectl_list(job(active=1), past))["state"] == "started"


def test_a_download_pod_without_its_image_blocks_the_job():
    stuck = pod("dinops-download-4kq", init=(), containers=[waiting("download", "ErrImageNeverPull", image="x:1")])
    state = rollout.job_progress(kubectl_list(job("dinops-download", active=1), stuck))
    assert state["state"] == "blocked"
    assert "cannot get image x:1 (ErrImageNeverPull" in state["message"]


def test_complete_missing_and_kubectl_errors():
    done = job("dinops-download", conditions=[{"type": "Complete", "status": "True"}])
    assert rollout.job_progress(kubectl_list(done))["state"] == "complete"
    assert rollout.job_progress(kubectl_list())["state"] == "missing"
    assert rollout.job_progress({"rc": 1, "stdout": "", "stderr": "Unauthorized"})["state"] == "unknown"


def test_a_failed_job_of_an_earlier_run_is_deleted_so_that_it_runs_again():
    desired = [job(), job("dinops-download"), deployment()]
    complete = [{"type": "Complete", "status": "True"}]
    live = [job(conditions=FAILED_BY_POLICY), job("dinops-download", conditions=complete),
            job("dinops-checkpoint", conditions=FAILED_BY_POLICY)]  # fmt: skip
    # dinops-checkpoint failed but is no longer applied: left alone.
    assert rollout.failed_jobs(desired, live) == ["dinops-train"]


# --- Inference's /healthz ----------------------------------------------------------------------------------------


def test_waiting_for_a_model_says_what_to_do_with_and_without_training():
    body = json.dumps({"status": "ok", "model": "waiting", "checkpoint": "/models/checkpoint.pth"})
    without = rollout.serve_state(body, False)
    assert without["state"] == "waiting"
    assert without["message"] == (
        "inference is waiting for a model at /models/checkpoint.pth: set dinops_train: true on a host whose profile "
        "lists train, or workloads_checkpoint_url + workloads_checkpoint_sha256, or copy a checkpoint to "
        "/models/checkpoint.pth in the output volume"
    )
    with_training = rollout.serve_state({"rc": 0, "stdout": body, "stderr": ""}, True)
    assert with_training["message"] == (
        "inference is waiting for a model at /models/checkpoint.pth: training is running and its first checkpoint "
        "will be loaded"
    )


def test_serving_loading_failed_and_garbage():
    assert rollout.serve_state({"model": "ready", "checkpoint": "/models/c.pth"})["state"] == "serving"
    assert rollout.serve_state({"model": "loading"}, checkpoint_path="/models/c.pth")["message"] == (
        "inference is loading the model from /models/c.pth"
    )
    failed = rollout.serve_state({"model": "failed", "checkpoint": "/models/c.pth", "error": "CUDA out of memory"})
    assert failed == {
        "state": "failed",
        "message": "inference could not load the model from /models/c.pth: CUDA out of memory",
        "checkpoint": "/models/c.pth",
    }
    # What apps/src/dinops/serve/health.py answers today: no error in /healthz, so the log is named.
    silent = rollout.serve_state({"status": "alive", "model": "failed", "checkpoint": "/models/c.pth"}, False, "", "ml")
    assert silent["message"] == (
        "inference could not load the model from /models/c.pth: its log says why: "
        "kubectl -n ml logs deploy/dinops-serve"
    )
    assert rollout.serve_state("<html>503</html>")["state"] == "failed"
    assert rollout.serve_state({"status": "ok"})["state"] == "failed"
    refused = rollout.serve_state({"rc": 1, "stdout": "", "stderr": "Error from server (ServiceUnavailable)"})
    assert refused["state"] == "unknown"


def test_the_service_proxy_path():
    assert rollout.service_proxy_path("dinops", "dinops-serve", "http", "healthz") == (
        "/api/v1/namespaces/dinops/services/dinops-serve:http/proxy/healthz"
    )
    with pytest.raises(rollout.RolloutError, match="workloads_namespace"):
        rollout.service_proxy_path("a/b", "dinops-serve", "http", "healthz")


# --- wait.yml itself, against a kubectl that prints canned answers -----------------------------------------------

FAKE_KUBECTL = """#!/bin/sh
# Canned answers by what is asked: the last argument names the selector or the raw path.
dir=$(dirname "$0")
# A transient API error first, when asked for: the wait must retry it, not abort.
if [ -e "$dir/fail-once" ]; then
  rm "$dir/fail-once"
  echo "The connection to the server 192.168.49.2:8443 was refused - did you specify the right host or port?" >&2
  exit 1
fi
for arg in "$@"; do
  case "$arg" in
    --selector=app.kubernetes.io/name=*) cat "$dir/${arg#--selector=app.kubernetes.io/name=}.json"; exit 0 ;;
    */proxy/healthz) cat "$dir/healthz.json"; exit 0 ;;
  esac
done
echo "unexpected: $*" >&2
exit 1
"""


def run_wait(tmp: Path, answers: dict[str, object], applied: list[str]) -> subprocess.CompletedProcess:
    for name, answer in answers.items():
        (tmp / f"{name}.json").write_text(answer if isinstance(answer, str) else json.dumps(answer))
    kubectl = tmp / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    objects = [{"kind": "Job" if name in ("dinops-download", "dinops-train") else "Deployment",
                "metadata": {"name": name}} for name in applied]  # fmt: skip
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {
                "__workloads_objects": objects,
                "workloads_kubectl": str(kubectl),
                "workloads_kubeconfig": "/nonexistent/kubeconfig",
                "workloads_namespace": "dinops",
                "workloads_download_timeout": 10,
                "workloads_train_start_timeout": 5,
                "workloads_rollout_timeout": 10,
                "workloads_serve_load_timeout": 10,
                "workloads_unschedulable_grace": 60,
                "workloads_fact_file": str(tmp / "facts.d" / "dinops_workloads.fact"),
            },
            "tasks": [{"name": "Run the role's waits", "ansible.builtin.include_tasks": str(
                REPO / "roles/workloads/tasks/wait.yml")}],
        }
    ]  # fmt: skip
    return ansible_playbook(tmp, play, config=f"filter_plugins = {REPO}/roles/workloads/filter_plugins\n")


DONE = job("dinops-download", conditions=[{"type": "Complete", "status": "True"}])
SERVE_UP = [deployment(), pod(phase="Running", containers=[running("serve")])]
CLIENT_UP = [deployment("dinops-client"), pod("dinops-client-1", "Running", [running("client")])]
TRAINING = [job(active=1), pod("dinops-train-x9k2l", "Running", [running("train")], [terminated("wait-for-dataset")])]


def test_wait_reports_a_model_it_waits_for_as_waiting_and_records_it(tmp_path):
    result = run_wait(
        tmp_path,
        {
            "dinops-download": kubectl_list(DONE),
            "dinops-train": kubectl_list(*TRAINING),
            "dinops-serve": kubectl_list(*SERVE_UP),
            "dinops-client": kubectl_list(*CLIENT_UP),
            "healthz": {"status": "ok", "model": "waiting", "checkpoint": "/models/checkpoint.pth"},
        },
        ["dinops-download", "dinops-train", "dinops-serve", "dinops-client"],
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "WAITING: inference is waiting for a model at /models/checkpoint.pth: training is running" in result.stdout
    fact = json.loads((tmp_path / "facts.d" / "dinops_workloads.fact").read_text())
    assert fact["serve"]["state"] == "waiting"
    assert fact["train"] == "started"
    assert fact["workloads"] == ["dinops-download", "dinops-train", "dinops-serve", "dinops-client"]


def test_wait_fails_at_once_on_a_failed_training_job(tmp_path):
    result = run_wait(
        tmp_path,
        {"dinops-download": kubectl_list(DONE), "dinops-train": kubectl_list(job(conditions=FAILED_BY_POLICY))},
        ["dinops-download", "dinops-train"],
    )
    assert result.returncode != 0
    assert "Job dinops-train failed (PodFailurePolicy)" in result.stdout


def test_wait_fails_a_rollout_whose_image_is_missing_and_waits_only_for_what_was_applied(tmp_path):
    stuck = pod(containers=[waiting("serve", "ErrImagePull", "not found")])
    # No download, no training, no client applied: their canned answers do not exist and are never asked for.
    result = run_wait(tmp_path, {"dinops-serve": kubectl_list(deployment(available=0), stuck)}, ["dinops-serve"])
    assert result.returncode != 0
    assert "cannot get image dinops-serve:0.1.0-abc (ErrImagePull: not found)" in result.stdout
    assert "unexpected:" not in result.stdout + result.stderr


def test_wait_retries_a_transient_kubectl_error_and_waits_only_for_the_client(tmp_path):
    (tmp_path / "fail-once").write_text("")
    result = run_wait(tmp_path, {"dinops-client": kubectl_list(*CLIENT_UP)}, ["dinops-client"])
    assert result.returncode == 0, result.stdout[-3000:]
    assert "FAILED - RETRYING" in result.stdout
    assert not (tmp_path / "fail-once").exists()
    fact = json.loads((tmp_path / "facts.d" / "dinops_workloads.fact").read_text())
    assert fact["serve"]["state"] == "not-applied"
    assert "WAITING" not in result.stdout
