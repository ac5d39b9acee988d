"""Every shipped inventory loads the images into its cluster: images_load follows dinops_cluster (finding 3).

The role's defaults are resolved the way a play resolves them: a playbook that applies the images role with every
task skipped by tag, then prints images_load from a tagged task (role defaults are visible to the play). Nothing
connects to a host: the role's argument validation and debug run on the controller.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from dinops_testing import REPO

PLAYBOOK = """
- name: Resolve images_load
  hosts: gpu_hosts
  gather_facts: false
  roles:
    - role: images
  tasks:
    - name: Print what the images role would load into
      ansible.builtin.debug:
        msg: "{{ {'cluster': dinops_cluster | default('minikube'), 'load': images_load} }}"
      tags: [resolve]
"""


def resolve(tmp_path, inventory, *extra):
    playbook = tmp_path / "resolve.yml"
    playbook.write_text(PLAYBOOK)
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(REPO / "roles"),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_FACT_CACHING="memory",
    )
    result = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), str(playbook), "--tags", "resolve", *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    tasks = json.loads(out[out.index("{\n") : out.rindex("}") + 1])["plays"][0]["tasks"]
    (debug,) = [task for task in tasks if task["task"]["name"] == "Print what the images role would load into"]
    return {host: value["msg"] for host, value in debug["hosts"].items()}


@pytest.fixture
def aws_inventory(tmp_path):
    """inventories/aws as its dynamic inventory resolves it (one group per GpuProfile under gpu_hosts), static."""
    copy = tmp_path / "aws"
    shutil.copytree(REPO / "inventories/aws/group_vars", copy / "group_vars")
    hosts = {
        "all": {
            "children": {
                "gpu_hosts": {
                    "children": {
                        "a10g": {"hosts": {"dinops-train": {"ansible_host": "192.0.2.30"}}},
                        "t4": {"hosts": {"dinops-serve": {"ansible_host": "192.0.2.31"}}},
                    }
                }
            }
        }
    }
    (copy / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return copy


def test_aws_inventory_loads_into_minikube(tmp_path, aws_inventory):
    """The AWS inventory sets neither dinops_cluster nor images_load: minikube, and the images go into it."""
    assert resolve(tmp_path, aws_inventory) == {
        "dinops-train": {"cluster": "minikube", "load": "minikube"},
        "dinops-serve": {"cluster": "minikube", "load": "minikube"},
    }


def test_example_inventory_loads_into_minikube(tmp_path):
    resolved = resolve(tmp_path, REPO / "inventories/example")
    assert resolved == {host: {"cluster": "minikube", "load": "minikube"} for host in ("infer-1", "train-1")}


def test_local_inventory_follows_the_gpu_decision(tmp_path):
    """No GPU facts here: the local inventory's cluster is the Docker runtime (the CPU demo), whose images stay in the
    host's Docker, so nothing is loaded; asked for minikube, they are."""
    assert resolve(tmp_path, REPO / "inventories/local") == {"localhost": {"cluster": "docker", "load": "none"}}
    resolved = resolve(tmp_path, REPO / "inventories/local", "-e", "dinops_cluster=minikube")
    assert resolved == {"localhost": {"cluster": "minikube", "load": "minikube"}}


@pytest.mark.parametrize(
    ("group_vars", "load"),
    [
        ({"dinops_cluster": "k3s"}, "k3s"),
        ({"dinops_cluster": "none"}, "none"),
        # An explicit setting still wins over the cluster's default.
        ({"dinops_cluster": "minikube", "images_load": "tarball"}, "tarball"),
        ({"dinops_cluster": "k3s", "images_load": "none"}, "none"),
    ],
)
def test_images_load_follows_the_cluster_and_can_be_overridden(tmp_path, aws_inventory, group_vars, load):
    all_vars = aws_inventory / "group_vars/all.yml"
    all_vars.write_text(all_vars.read_text() + yaml.safe_dump(group_vars))
    assert {value["load"] for value in resolve(tmp_path, aws_inventory).values()} == {load}


def test_no_shipped_inventory_repeats_the_default():
    """The line the default replaces is gone from every inventory (so none can get it wrong again)."""
    for path in (REPO / "inventories").glob("*/group_vars/*.yml"):
        assert "images_load" not in (yaml.safe_load(path.read_text()) or {}), path
