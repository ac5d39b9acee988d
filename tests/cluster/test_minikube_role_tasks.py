"""Expressions of the minikube role evaluated by ansible-core's own templating (no host needed)."""

from __future__ import annotations

import json

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from dinops_testing import REPO

ROLE = REPO / "roles/minikube"


def templar(**variables):
    return Templar(loader=DataLoader(), variables=variables)


def nodes(*allocatable):
    return json.dumps({"items": [{"status": {"allocatable": item}} for item in allocatable]})


@pytest.fixture(scope="module")
def gpu_wait_until():
    tasks = yaml.safe_load((ROLE / "tasks/node.yml").read_text())
    (task,) = [task for task in tasks if "until" in task]
    return trust_as_template(task["until"])


@pytest.mark.parametrize(
    ("result", "done"),
    [
        # A transient kubectl failure (API server restarting): retried, not a from_json error (finding 21).
        ({"rc": 1, "stdout": "", "stderr": "connection refused"}, False),
        ({"rc": 0, "stdout": nodes({"cpu": "4"})}, False),
        ({"rc": 0, "stdout": nodes({"cpu": "4", "nvidia.com/gpu": "1"})}, True),
        ({"rc": 0, "stdout": nodes({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "0"})}, True),
    ],
)
def test_gpu_wait_retries_a_failed_kubectl_call(gpu_wait_until, result, done):
    variables = {"__minikube_nodes_result": result, "minikube_expected_gpus": "1"}
    assert templar(**variables).evaluate_conditional(gpu_wait_until) is done


@pytest.fixture(scope="module")
def defaults():
    return yaml.safe_load((ROLE / "defaults/main.yml").read_text())


@pytest.mark.parametrize(
    ("driver", "profile", "user"), [("docker", "dinops", "minikube"), ("none", "minikube", "root")]
)
def test_profile_and_user_follow_the_driver(defaults, driver, profile, user):
    """The none driver supports only the profile "minikube" (v1.37.0 validateBareMetal) and runs as root."""
    variables = {**defaults, "minikube_driver": driver}
    assert templar(**variables).template(trust_as_template(defaults["minikube_profile"])) == profile
    assert templar(**variables).template(trust_as_template(defaults["minikube_user"])) == user


def test_boot_unit_starts_the_existing_profile_after_docker():
    template = trust_as_template((ROLE / "templates/minikube.service.j2").read_text())
    variables = {
        "ansible_managed": "managed by dinops",
        "minikube_profile": "dinops",
        "minikube_user": "minikube",
        "minikube_bin_dir": "/usr/local/bin",
        "minikube_wait_timeout": 600,
        "minikube_proxy_env": {"https_proxy": "http://u%40x:p@proxy:3128", "no_proxy": "localhost"},
        "__minikube_home": "/home/minikube",
    }
    lines = templar(**variables).template(template).splitlines()
    for line in [
        "After=network-online.target docker.service",
        "Requires=docker.service",
        "ConditionPathExists=/home/minikube/.minikube/profiles/dinops/config.json",
        "Type=oneshot",
        "User=minikube",
        # systemd expands % specifiers: a literal % is written %%.
        'Environment="https_proxy=http://u%%40x:p@proxy:3128"',
        'Environment="no_proxy=localhost"',
        "ExecStart=/usr/local/bin/minikube start --profile=dinops",
        "TimeoutStartSec=900",
        "WantedBy=multi-user.target",
    ]:
        assert line in lines
