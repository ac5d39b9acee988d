"""Expressions of the minikube role evaluated by ansible-core's own templating (no host needed)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from dinops_testing import REPO

ROLE = REPO / "roles/minikube"
FACTS = {"architecture": "x86_64", "processor_vcpus": 8, "memtotal_mb": 16000}


def templar(**variables):
    return Templar(loader=DataLoader(), variables=variables)


def role_variables(**inventory):
    """The role's defaults under ``inventory`` under its internal vars, trusted as templates as Ansible loads them."""
    loader = DataLoader()
    defaults = loader.load_from_file(str(ROLE / "defaults/main.yml"), trusted_as_template=True)
    internal = loader.load_from_file(str(ROLE / "vars/main.yml"), trusted_as_template=True)
    return {**defaults, **inventory, **internal}


def render(path, **variables):
    """A role template as the template module and lookup render it: their string literals' backslash escapes are
    Jinja's (ansible-core 2.19 plugins/action/template.py passes escape_backslashes=False; trim_blocks is on)."""
    template = trust_as_template((ROLE / path).read_text())
    return templar(**variables).template(template, escape_backslashes=False, overrides={"trim_blocks": True})


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


@pytest.mark.parametrize(
    ("inventory", "memory_mb", "tolerance_percent"),
    [
        # 3/4 of MemTotal: moves with the kernel, so it gets the tolerance (finding F9).
        ({}, 12000, 3),
        ({"ansible_facts": {**FACTS, "memtotal_mb": 2000}}, 2048, 3),
        # What the inventory sets compares exactly.
        ({"gpu_profile": {"cluster_memory_mb": 10240}}, 10240, 0),
        ({"minikube_memory_mb": 8192}, 8192, 0),
        ({"minikube_memory_mb": 8192, "gpu_profile": {"cluster_memory_mb": 10240}}, 8192, 0),
    ],
)
def test_only_memory_taken_from_the_host_gets_the_tolerance(inventory, memory_mb, tolerance_percent):
    # minikube_addons: the role's own filter, which this Templar does not load.
    variables = role_variables(**{"ansible_facts": FACTS, "ansible_local": {}, "minikube_addons": [], **inventory})
    desired = json.loads(render("templates/desired.json.j2", **variables))
    assert (desired["memory_mb"], desired["memory_tolerance_percent"]) == (memory_mb, tolerance_percent)


def boot_unit_variables(**overrides):
    host = {
        "ansible_managed": "managed by dinops",
        "ansible_facts": FACTS,
        "minikube_proxy_env": {"https_proxy": "http://u%40x:p@proxy:3128", "no_proxy": "localhost"},
        # tasks/user.yml's set_fact
        "__minikube_home": "/home/minikube",
    }
    return role_variables(**{**host, **overrides})


def test_boot_unit_starts_the_existing_profile_after_docker():
    lines = render("templates/minikube.service.j2", **boot_unit_variables()).splitlines()
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


def exec_start_post_script(unit: str) -> str:
    """The shell script of the unit's one ExecStartPost=+/bin/sh -ec "...", unquoted as systemd does: one
    double-quoted item whose \\ and \" are C escapes (systemd.syntax(7)), $$ and %% a literal $ and %."""
    lines = [line for line in unit.splitlines() if line.startswith("ExecStartPost=")]
    assert len(lines) == 1, f"one ExecStartPost expected, the unit has {lines}"
    (line,) = lines
    # "+": full privileges (root), as the kubeconfig task runs; User= applies to ExecStart only.
    match = re.fullmatch(r'ExecStartPost=\+/bin/sh -ec "(.*)"', line)
    assert match, line
    quoted = match[1]
    assert not re.search(r'["$%\\]', re.sub(r"\\.|\$\$|%%", "", quoted)), f"unescaped in {quoted}"
    return re.sub(r"\\(.)|\$\$|%%", lambda m: m[1] or m[0][0], quoted)


@pytest.fixture
def kubeconfig_host(tmp_path):
    """A kubectl that records its arguments and prints a kubeconfig, a chown that records its arguments (the test
    is not root), and an old kubeconfig with the API server's port before the reboot."""
    bin_dir, fakes, etc = tmp_path / "bin", tmp_path / "fakes", tmp_path / "etc/dinops"
    for directory in (bin_dir, fakes, etc):
        directory.mkdir(parents=True)
    (bin_dir / "kubectl").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$0" "$@" >"$(dirname "$0")/kubectl.args"\n'
        "[ -z \"$KUBECTL_FAILS\" ] || exit 1\nprintf 'server: https://127.0.0.1:32771\\n'\n"
    )
    (fakes / "chown").write_text('#!/bin/sh\nprintf "%s\\n" "$@" >"$(dirname "$0")/chown.args"\n')
    for program in (bin_dir / "kubectl", fakes / "chown"):
        program.chmod(0o755)
    (etc / "kubeconfig").write_text("server: https://127.0.0.1:32768\n")
    variables = boot_unit_variables(
        minikube_bin_dir=str(bin_dir), minikube_kubeconfig_path=str(etc / "kubeconfig"), minikube_proxy_env={}
    )
    return {"variables": variables, "bin": bin_dir, "fakes": fakes, "etc": etc}


def run_exec_start_post(host, **env):
    script = exec_start_post_script(render("templates/minikube.service.j2", **host["variables"]))
    path = f"{host['fakes']}:{os.environ['PATH']}"
    return subprocess.run(["/bin/sh", "-ec", script], env={"PATH": path, **env}, check=False)


def test_boot_unit_writes_the_kubeconfig_again_as_the_kubeconfig_task_does(kubeconfig_host):
    """After a reboot the docker driver publishes the API server on a new port (finding F10): the unit writes the
    flattened copy again, with the task's command, to the task's path, with the task's owner and mode."""
    host, variables = kubeconfig_host, kubeconfig_host["variables"]
    tasks = {task["name"]: task for task in yaml.safe_load((ROLE / "tasks/kubeconfig.yml").read_text())}
    flatten = tasks["kubeconfig | Flatten the profile's context into one self-contained document"]
    copy = tasks["kubeconfig | Write the copies for later stages and users"]["ansible.builtin.copy"]
    # The copy for later stages is the loop's item '' (the others are the users' ~/.kube/config).
    item = {**variables, "minikube_kubeconfig_item": ""}
    item["__minikube_kubeconfig_copy"] = trust_as_template(
        tasks["kubeconfig | Write the copies for later stages and users"]["vars"]["__minikube_kubeconfig_copy"]
    )
    dest, owner, group, mode = (
        templar(**item).template(trust_as_template(copy[key])) for key in ("dest", "owner", "group", "mode")
    )
    old = (host["etc"] / "kubeconfig").stat().st_ino

    assert run_exec_start_post(host).returncode == 0

    argv = templar(**variables).template(trust_as_template(flatten["ansible.builtin.command"]["argv"]))
    assert (host["bin"] / "kubectl.args").read_text().splitlines() == argv
    # The task writes the command module's stdout (trailing newlines stripped) plus one newline.
    stdout = "server: https://127.0.0.1:32771\n".rstrip("\r\n")
    written = host["etc"] / "kubeconfig"
    assert str(written) == dest
    assert written.read_text() == templar(__minikube_kubeconfig_result={"stdout": stdout}).template(
        trust_as_template(copy["content"])
    )
    assert oct(written.stat().st_mode & 0o7777) == oct(int(mode, 8))
    chown, temporary = (host["fakes"] / "chown.args").read_text().splitlines()
    assert chown == f"{owner}:{group}"
    # Written beside it and renamed over it: a reader sees the old file or the new one, never a partial one.
    assert os.path.dirname(temporary) == str(host["etc"]) and written.stat().st_ino != old
    assert sorted(path.name for path in host["etc"].iterdir()) == ["kubeconfig"]


def test_boot_unit_keeps_the_old_kubeconfig_when_kubectl_fails(kubeconfig_host):
    assert run_exec_start_post(kubeconfig_host, KUBECTL_FAILS="1").returncode != 0
    assert sorted(path.name for path in kubeconfig_host["etc"].iterdir()) == ["kubeconfig"]
    assert (kubeconfig_host["etc"] / "kubeconfig").read_text() == "server: https://127.0.0.1:32768\n"
