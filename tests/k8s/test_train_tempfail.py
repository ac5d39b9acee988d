"""Exit status 75 of `dinops train` (EX_TEMPFAIL: its S3 output stayed unreachable beyond --s3-retry-minutes) on every
runtime (issue 26): a temporary failure that is retried without using up the Job's retries, while 2 (a bad setting)
fails the Job at once and 1 counts as any failure.

- Kubernetes: the batch Job's podFailurePolicy has an Ignore rule on exit 75 of the train container, valid for every
  Kubernetes version we test (Ignore on onExitCodes is stable since 1.31, KEP-3329; k3s and minikube are pinned to
  1.33); the TrainJob's node Job and a Katib trial of the batch Job keep it, a PyTorchJob has no podFailurePolicy.
- Docker: the rendered train workload carries the Ignore codes beside the FailJob ones; the wait reports a container
  that exited 75 as waiting for its storage, not failed, while Docker's restart policy still restarts it.
"""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml
from k8s.crd_schema import requires_crds, validate
from k8s.k8s_render import (
    DOCKER_VARIANTS,
    OVERLAYS,
    TRAIN_KIND_VARIANTS,
    find,
    load_workloads_filters,
    render_site,
    render_train_kind,
)

from dinops_testing import REPO

TEMPFAIL = 75
# The versions tests/k8s/test_render_and_schema.py validates every object for.
KUBERNETES_VERSIONS = ("1.28", "1.29", "1.30", "1.31", "1.32", "1.33")
IGNORE_75 = {
    "action": "Ignore",
    "onExitCodes": {"containerName": "train", "operator": "In", "values": [TEMPFAIL]},
    "onPodConditions": [],
}
DOCKER = load_workloads_filters("docker_runtime")
STATE = load_workloads_filters("docker_state")
WORKLOADS = load_workloads_filters()
JOBS = load_workloads_filters("jobs")
SIZING = load_workloads_filters("sizing")
SETTINGS = {"data_dir": "/var/lib/dinops/volumes", "network": "dinops"}


def test_75_is_what_dinops_train_exits_with_when_its_s3_output_stays_unreachable():
    from dinops.train.s3_output import EXIT_S3_UNREACHABLE

    assert EXIT_S3_UNREACHABLE == TEMPFAIL


def test_the_pinned_kubernetes_versions_have_ignore_on_exit_codes():
    """podFailurePolicy (onExitCodes, action Ignore): alpha 1.25, beta (on by default) 1.26, stable 1.31
    (https://kubernetes.io/docs/tasks/job/pod-failure-policy/, KEP-3329)."""
    pinned = [
        yaml.safe_load((REPO / "roles" / "k3s" / "defaults" / "main.yml").read_text())["k3s_version"],
        yaml.safe_load((REPO / "roles" / "minikube" / "defaults" / "main.yml").read_text())[
            "minikube_kubernetes_version"
        ],
    ]
    for version in pinned:
        major, minor = (int(x) for x in re.match(r"^v(\d+)\.(\d+)\.", version).groups())
        assert (major, minor) >= (1, 31), version


# --- Kubernetes: the batch Job ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_train_job_ignores_exit_75_and_stays_schema_valid(rendered, overlay):
    job = find(rendered[overlay], "Job", "dinops-train")
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert IGNORE_75 in rules
    # No other rule matches 75 (the first matching rule decides), 2 still fails the Job at once.
    assert [r for r in rules if TEMPFAIL in (r.get("onExitCodes") or {}).get("values", [])] == [IGNORE_75]
    assert {"containerName": "train", "operator": "In", "values": [2]} in [r.get("onExitCodes") for r in rules]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    # The download never exits 75: its policy is unchanged.
    download = find(rendered[overlay], "Job", "dinops-download")
    assert all(
        TEMPFAIL not in (r.get("onExitCodes") or {}).get("values", [])
        for r in download["spec"]["podFailurePolicy"]["rules"]
    )


# --- Kubernetes: the Kubeflow kinds ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folded(tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("tempfail-kinds")
    names = ("kind-cpu-demo-trainjob", "kind-cpu-demo-pytorchjob", "kind-cpu-demo-job-hpo")
    return {name: render_train_kind(root, name, TRAIN_KIND_VARIANTS[name]) for name in names}


def test_a_trainjob_node_ignores_exit_75_of_its_node_container(folded):
    runtime = find(folded["kind-cpu-demo-trainjob"], "TrainingRuntime", "dinops-train-runtime")
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    rules = node["template"]["spec"]["podFailurePolicy"]["rules"]
    assert {**IGNORE_75, "onExitCodes": {**IGNORE_75["onExitCodes"], "containerName": "node"}} in rules


@requires_crds
def test_the_trainjob_runtime_with_the_rule_validates_against_its_release(folded):
    runtime = find(folded["kind-cpu-demo-trainjob"], "TrainingRuntime", "dinops-train-runtime")
    assert validate({**runtime, "kind": "ClusterTrainingRuntime"}) == []


def test_a_pytorchjob_has_no_pod_failure_policy_to_carry_it(folded):
    """Documented in train_kinds.py: a PyTorchJob's restarts count 75 as any failure."""
    job = find(folded["kind-cpu-demo-pytorchjob"], "PyTorchJob", "dinops-train")
    assert "podFailurePolicy" not in json.dumps(job)
    assert set(job["spec"]["runPolicy"]) == {"backoffLimit"}


def test_a_batch_job_trial_keeps_the_rule(folded):
    experiment = find(folded["kind-cpu-demo-job-hpo"], "Experiment", "dinops-hpo")
    trial = experiment["spec"]["trialTemplate"]["trialSpec"]
    assert IGNORE_75 in trial["spec"]["podFailurePolicy"]["rules"]


# --- Docker ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def containers(tmp_path_factory) -> dict[str, dict]:
    settings = DOCKER_VARIANTS["docker-cpu-demo"]
    plan = SIZING.site_plan(settings)
    objects = render_site(tmp_path_factory.mktemp("tempfail-demo"), "docker-cpu-demo", settings)
    objects = JOBS.prepare_objects(objects, plan["apps"]["train"], plan["apps"]["download"])
    return {c["name"]: c for c in DOCKER.docker_plan(objects, SETTINGS)["containers"]}


def test_the_docker_train_container_carries_the_ignored_exit_code(containers):
    train = containers["dinops-train"]
    assert train["ignore_exit_codes"] == [TEMPFAIL]
    assert train["fail_exit_codes"] == [2]
    # Docker's restart policy restarts 75 as any non-zero exit, and counts it (on-failure:N has no exit-code filter).
    assert (train["restart_policy"], train["restart_retries"]) == ("on-failure", 6)
    assert "ignore_exit_codes" not in containers["dinops-download"]


def _info(code: int, restarts: int, restarting: bool, hash_: str) -> dict:
    status = "restarting" if restarting else "exited"
    return {"exists": True, "container": {"Config": {"Labels": {"dinops.io/template-sha256": hash_}},
            "RestartCount": restarts, "State": {"Status": status, "Running": False, "Restarting": restarting,
                                                "ExitCode": code}}}  # fmt: skip


@pytest.mark.parametrize(("restarts", "restarting"), [(1, True), (3, False), (6, True)])
def test_an_exit_75_that_docker_restarts_is_waiting_for_storage(containers, restarts, restarting):
    train = containers["dinops-train"]
    info = _info(TEMPFAIL, restarts, restarting, train["labels"]["dinops.io/template-sha256"])
    state = STATE.docker_job_state(info, train)
    assert state["state"] == "waiting-for-storage", state
    assert "exit code 75" in state["message"] and "storage" in state["message"]
    # Exit 1 is as before.
    other = STATE.docker_job_state(_info(1, restarts, restarting, info["container"]["Config"]["Labels"][
        "dinops.io/template-sha256"]), train)  # fmt: skip
    assert other["state"] == ("restarting" if restarting else "exited")


def test_an_exit_75_after_dockers_last_restart_is_failed_with_what_to_do(containers):
    """Docker counts 75 against its restart count: once it gave up, nothing restarts the container (Kubernetes would
    go on): failed, saying why and how to resume."""
    train = containers["dinops-train"]
    state = STATE.docker_job_state(_info(TEMPFAIL, 6, False, train["labels"]["dinops.io/template-sha256"]), train)
    assert state["state"] == "failed"
    assert "exit code 75" in state["message"] and "storage" in state["message"]
    assert "workloads stage again" in state["message"]


def test_the_wait_reports_waiting_for_storage_and_does_not_fail_on_it():
    tasks = yaml.safe_load((REPO / "roles" / "workloads" / "tasks" / "docker_wait.yml").read_text())
    wait = next(t for t in tasks if t["name"].startswith("docker_wait | Wait for training"))
    assert "'waiting-for-storage'" in wait["until"]
    stop = next(t for t in tasks if t["name"] == "docker_wait | Stop when training failed")
    assert "waiting-for-storage" not in stop["when"]
