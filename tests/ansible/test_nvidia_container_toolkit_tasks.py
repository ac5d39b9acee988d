"""What the GPU-host roles' task files promise beyond a filter: udev trigger, apt lock wait, dev-char's change."""

from __future__ import annotations

import json

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader
from ansible.template import Templar, trust_as_template

from dinops_testing import REPO

RULE = REPO / "roles/nvidia_container_toolkit/templates/71-nvidia-dev-char.rules.j2"
ROLES = ("nvidia_container_toolkit", "docker")
TASK_FILES = sorted(path for role in ROLES for path in (REPO / "roles" / role / "tasks").glob("*.yml"))


def test_udev_rule_runs_when_nvidia_uvm_is_loaded_and_loads_the_modules_itself():
    """--create-all needs the nvidia-uvm major (nvidia-container-toolkit@v1.17.8 create-dev-char-symlinks/all.go)."""
    rules = [line for line in RULE.read_text().splitlines() if line and not line.startswith(("#", "{{"))]
    assert rules == [
        'ACTION=="add", SUBSYSTEM=="module", DEVPATH=="/module/nvidia_uvm|/module/nvidia_current_uvm", '
        'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all --load-kernel-modules"'
    ]


def apt_tasks(path):
    for task in yaml.safe_load(path.read_text()) or []:
        for inner in [task, *task.get("block", [])]:
            if "ansible.builtin.apt" in inner:
                yield inner


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_apt_tasks_wait_for_the_dpkg_lock_of_a_fresh_cloud_vm(path):
    """unattended-upgrades holds the lock for minutes after first boot; the module's default wait is 60 s."""
    defaults = yaml.safe_load((path.parents[1] / "defaults/main.yml").read_text())
    templar = Templar(loader=DataLoader(), variables=defaults)
    for task in apt_tasks(path):
        timeout = task["ansible.builtin.apt"].get("lock_timeout")
        rendered = templar.template(trust_as_template(timeout)) if isinstance(timeout, str) else timeout
        assert int(rendered or 0) == 600, task["name"]


def test_some_apt_task_was_checked():
    assert any(list(apt_tasks(path)) for path in TASK_FILES)


# What nvidia-ctk v1.17.8 logs (logrus text format, no terminal) when every link exists already: "Creating link" for
# each node, then a warning because os.Symlink finds the link (create-dev-char-symlinks.go, CreateLinks).
SECOND_RUN_LOG = "".join(
    f'time="2025-10-02T09:14:03Z" level=info msg="Creating link /dev/char/{link} => {node}"\n'
    f'time="2025-10-02T09:14:03Z" level=warning msg="Could not create symlink: symlink {node} /dev/char/{link}:'
    ' file exists"\n'
    for link, node in [("195:254", "/dev/nvidia-modeset"), ("195:255", "/dev/nvidiactl"), ("195:0", "/dev/nvidia0")]
)
LINKS = "195:254 /dev/nvidia-modeset\n195:255 /dev/nvidiactl\n195:0 /dev/nvidia0\n"


def dev_char_task():
    tasks = [
        task
        for path in sorted((REPO / "roles/nvidia_container_toolkit/tasks").glob("*.yml"))
        for task in yaml.safe_load(path.read_text()) or []
        if "create-dev-char-symlinks" in json.dumps(task)
    ]
    assert len(tasks) == 1
    return tasks[0]


def changed(task, stdout, stderr):
    filter_loader.add_directory(str(REPO / "roles/nvidia_container_toolkit/filter_plugins"))
    result = {"rc": 0, "stdout": stdout, "stderr": stderr, "stdout_lines": stdout.splitlines()}
    templar = Templar(loader=DataLoader(), variables={task["register"]: result})
    condition = task["changed_when"]
    return templar.evaluate_conditional(trust_as_template(condition if isinstance(condition, str) else condition[0]))


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [(f"{LINKS}--\n{LINKS}", False), (f"--\n{LINKS}", True)],
    ids=["links-there", "links-missing"],
)
def test_dev_char_task_reports_a_change_only_when_links_were_created(stdout, expected):
    assert changed(dev_char_task(), stdout, SECOND_RUN_LOG) is expected
