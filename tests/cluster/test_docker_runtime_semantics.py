"""What the Docker runtime's translation used to drop silently (round2 audit, findings 7, 9, 10), and the docker role's
drop-in filter that orders dockerd after the claims' mounts.

- 9: a liveness probe is GET by the health check too (not only readiness); a Job's or Deployment's own spec fields
  are checked like the pod's; podFailurePolicy's FailJob exit codes make the Job's state failed at the first such
  exit, not after the restart policy's retries.
- 10: a disk emptyDir is an anonymous volume on Docker's data root, not a tmpfs in RAM inside the memory limit; the
  role removes those volumes with their container.
- 7: the plan names what dockerd needs before it starts; the docker role turns it into a systemd drop-in.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from k8s.k8s_render import DOCKER_VARIANTS, load_workloads_filters, render_site

from dinops_testing import REPO, load_plugin

DOCKER = load_workloads_filters("docker_runtime")
STATE = load_workloads_filters("docker_state")
WORKLOADS = load_workloads_filters()
JOBS = load_workloads_filters("jobs")
SIZING = load_workloads_filters("sizing")
DROPIN = load_plugin("roles/docker/filter_plugins/docker_service_dropin.py")
SETTINGS = {"data_dir": "/var/lib/dinops/volumes", "network": "dinops"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> list[dict]:
    settings = DOCKER_VARIANTS["docker-cpu-demo"]
    plan = SIZING.site_plan(settings)
    objects = render_site(tmp_path_factory.mktemp("demo"), "docker-cpu-demo", settings)
    return JOBS.prepare_objects(objects, plan["apps"]["train"], plan["apps"]["download"])


def _containers(objects: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in DOCKER.docker_plan(objects, SETTINGS)["containers"]}


def _obj(objects: list[dict], name: str) -> dict:
    return next(o for o in objects if o["metadata"]["name"] == name and o["kind"] in ("Job", "Deployment"))


# --- 9: probes and Job semantics ------------------------------------------------------------------------------------


def test_the_health_check_gets_the_liveness_endpoint_too(demo):
    client = _obj(demo, "dinops-client")["spec"]["template"]["spec"]["containers"][0]
    assert client["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert client["livenessProbe"]["httpGet"]["path"] == "/healthz"
    code = _containers(demo)["dinops-client"]["healthcheck"]["test"][-1]
    assert "urlopen('http://127.0.0.1:8080/readyz', timeout=5)" in code
    assert "urlopen('http://127.0.0.1:8080/healthz', timeout=5)" in code
    # One GET per endpoint: serve's readiness and liveness are the same GET of /healthz.
    assert _containers(demo)["dinops-serve"]["healthcheck"]["test"][-1].count("urlopen(") == 1


def test_a_liveness_probe_alone_is_the_health_check(demo):
    objects = copy.deepcopy(demo)
    container = _obj(objects, "dinops-client")["spec"]["template"]["spec"]["containers"][0]
    del container["readinessProbe"]
    code = _containers(objects)["dinops-client"]["healthcheck"]["test"][-1]
    assert "/healthz" in code and "/readyz" not in code


@pytest.mark.parametrize(
    ("name", "field", "value", "said"),
    [
        ("dinops-train", "activeDeadlineSeconds", 3600, "does not translate ['spec.activeDeadlineSeconds']"),
        ("dinops-train", "ttlSecondsAfterFinished", 60, "does not translate ['spec.ttlSecondsAfterFinished']"),
        ("dinops-serve", "minReadySeconds", 5, "does not translate ['spec.minReadySeconds']"),
        ("dinops-serve", "replicas", 2, "runs one replica, got replicas 2"),
    ],
)
def test_fields_of_the_jobs_and_deployments_own_spec_are_checked(demo, name, field, value, said):
    objects = copy.deepcopy(demo)
    _obj(objects, name)["spec"][field] = value
    with pytest.raises(DOCKER.DockerRuntimeError, match=said.replace("[", r"\[").replace("]", r"\]")):
        DOCKER.docker_plan(objects, SETTINGS)


def test_fail_job_exit_codes_reach_the_containers(demo):
    containers = _containers(demo)
    assert containers["dinops-train"]["fail_exit_codes"] == [2]
    assert containers["dinops-download"]["fail_exit_codes"] == [2]
    assert "fail_exit_codes" not in containers["dinops-serve"]


def _info(code: int, restarts: int, restarting: bool, hash_: str) -> dict:
    status = "restarting" if restarting else "exited"
    return {"exists": True, "container": {"Config": {"Labels": {"dinops.io/template-sha256": hash_}},
            "RestartCount": restarts, "State": {"Status": status, "Running": False, "Restarting": restarting,
                                                "ExitCode": code}}}  # fmt: skip


@pytest.mark.parametrize("restarting", [True, False])
def test_a_fail_job_exit_is_failed_at_once_not_after_the_retries(demo, restarting):
    train = _containers(demo)["dinops-train"]
    state = STATE.docker_job_state(_info(2, 1, restarting, train["labels"]["dinops.io/template-sha256"]), train)
    assert state["state"] == "failed"
    assert "exit code 2 fails the Job at once (podFailurePolicy FailJob" in state["message"]
    # Any other failure is retried as before.
    other = STATE.docker_job_state(_info(1, 1, restarting, train["labels"]["dinops.io/template-sha256"]), train)
    assert other["state"] == ("restarting" if restarting else "exited")


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ({"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}}, "operator 'NotIn' is not"),
        (
            {"action": "FailJob", "onExitCodes": {"containerName": "x", "operator": "In", "values": [2]}},
            "container 'x'",
        ),
        ({"action": "Count", "onPodConditions": [{"type": "DisruptionTarget"}]}, "is not translated"),
        ({"action": "Ignore", "onPodConditions": [{"type": "ConfigIssue"}]}, "is not translated"),
    ],
)
def test_a_pod_failure_policy_it_cannot_honour_is_refused(demo, rule, said):
    objects = copy.deepcopy(demo)
    _obj(objects, "dinops-train")["spec"]["podFailurePolicy"] = {"rules": [rule]}
    with pytest.raises(DOCKER.DockerRuntimeError, match=f"Job dinops-train: podFailurePolicy .*{said}"):
        DOCKER.docker_plan(objects, SETTINGS)


# --- 10: emptyDirs ---------------------------------------------------------------------------------------------------


def test_disk_empty_dirs_are_volumes_and_memory_ones_stay_in_ram(demo):
    containers = _containers(demo)
    for name in ("dinops-download", "dinops-train", "dinops-serve", "dinops-client"):
        assert {"type": "volume", "target": "/tmp"} in containers[name]["mounts"], name
        assert not [m for m in containers[name]["mounts"] if m["type"] == "tmpfs"], name
    objects = copy.deepcopy(demo)
    pod = _obj(objects, "dinops-serve")["spec"]["template"]["spec"]
    next(v for v in pod["volumes"] if v["name"] == "tmp")["emptyDir"] = {"medium": "Memory", "sizeLimit": "256Mi"}
    assert {"type": "tmpfs", "target": "/tmp", "tmpfs_mode": "1777", "tmpfs_size": "256m"} in (
        _containers(objects)["dinops-serve"]["mounts"]
    )


def _task(path: str, name_start: str) -> dict:
    tasks = yaml.safe_load((REPO / "roles" / "workloads" / "tasks" / path).read_text())
    return next(t for t in tasks if t["name"].startswith(name_start))


def test_containers_take_their_volumes_with_them():
    """A recreated or removed container's anonymous volumes (its emptyDirs) go with it: a new one starts empty."""
    create = _task("docker_containers.yml", "docker_containers | Create or update each container")
    assert create["community.docker.docker_container"]["keep_volumes"] is False
    remove = _task("docker_remove.yml", "docker_remove | Stop and remove them")
    assert remove["community.docker.docker_container"]["keep_volumes"] is False


# --- 7: what dockerd needs before it starts -------------------------------------------------------------------------


def test_the_plan_names_the_claims_mounts_and_the_longest_stop_timeout(demo):
    plan = DOCKER.docker_plan(demo, SETTINGS)
    assert plan["service"] == {
        # Prometheus' TSDB (k8s/components/monitoring) is a claim's directory like the others.
        "requires_mounts_for": [
            "/var/lib/dinops/volumes/dinops-dataset",
            "/var/lib/dinops/volumes/dinops-output",
            "/var/lib/dinops/volumes/dinops-prometheus-data",
        ],
        "timeout_stop_s": 300 + 30,
    }


def test_the_drop_in_orders_after_the_mounts_and_sets_the_stop_timeout():
    dropin = DROPIN.dinops_docker_service_dropin("workloads", ["/srv/b", "/srv/a", "/srv/b"], 330)
    assert dropin == {
        "path": "/etc/systemd/system/docker.service.d/dinops-workloads.conf",
        "state": "present",
        "content": "[Unit]\nRequiresMountsFor=/srv/a /srv/b\n\n[Service]\nTimeoutStopSec=330\n",
    }
    assert DROPIN.dinops_docker_service_dropin("mounts", ["/srv/dinops/docker"])["content"] == (
        "[Unit]\nRequiresMountsFor=/srv/dinops/docker\n"
    )
    assert DROPIN.dinops_docker_service_dropin("mounts", [], 0)["state"] == "absent"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("Workloads", [], 0), "lower-case letters"),
        (("w", "/srv", 0), "must be a list of paths"),
        (("w", ["srv/a"], 0), "'srv/a' is not a normalised absolute path"),
        (("w", ["/srv/my data"], 0), "'/srv/my data' is not"),
        (("w", ["/srv/%h"], 0), "'/srv/%h' is not"),
        (("w", ["/srv/a/../b"], 0), "is not a normalised"),
        (("w", [], -1), "0 \\(unset\\) or more"),
        (("w", [], "soon"), "must be seconds"),
    ],
)
def test_bad_drop_in_input_is_refused_by_name(args, said):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match=said):
        DROPIN.dinops_docker_service_dropin(*args)
