"""Helpers for the repository-level tests (importable as `dinops_testing`; pytest.ini puts tests/ on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_plugin(relative_path: str):
    """Import an Ansible plugin file (filter_plugins/..., module_utils/...) as a plain Python module."""
    path = REPO / relative_path
    name = "dinops_plugin_" + "_".join(path.with_suffix("").parts[-3:])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def working_tree_files() -> list[Path]:
    """The repository's files as a fresh clone with the uncommitted changes has them: tracked and untracked, not
    ignored (no .venv, .cache, artifacts), files only, relative to REPO."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout  # fmt: skip
    return [Path(name.decode()) for name in listed.split(b"\0") if name and (REPO / name.decode()).is_file()]


def driver_plan_settings(release: str, kernel: str, kernel_flavour: str, **overrides) -> dict:
    """Settings for the nvidia_driver role's plan filter as the role builds them on a host with the role's defaults
    (branch, flavour, server, headless, prebuilt modules), the compatibility contract, no GPU and nothing installed;
    ``overrides`` replace any key. ``release`` is "ubuntu-24.04" or "debian-12"."""
    import yaml

    defaults = yaml.safe_load((REPO / "roles/nvidia_driver/defaults/main.yml").read_text())
    os_id, os_version = release.split("-")
    settings = {
        "os_id": os_id,
        "os_version": os_version,
        "kernel": kernel,
        "kernel_flavour": kernel_flavour,
        "gpus": [],
        "nvswitch_count": 0,
        "branch": defaults["nvidia_driver_branch"],
        "kernel_modules": defaults["nvidia_driver_kernel_modules"],
        "source": defaults["nvidia_driver_source"],
        "server": defaults["nvidia_driver_server"],
        "headless": defaults["nvidia_driver_headless"],
        "prebuilt_modules": defaults["nvidia_driver_prebuilt_modules"],
        "secure_boot": "disabled",
        "secure_boot_mok_enrolled": False,
        "contract": yaml.safe_load((REPO / "facts/nvidia.yml").read_text()),
        "installed": [],
        "held": [],
    }
    settings.update(overrides)
    return settings


def ansible_playbook(tmp: Path, play: list, inventory: str = "localhost,", config: str = ""):
    """Write ``play`` to tmp/play.yml and run it with this venv's ansible-playbook on ``inventory``, with an
    ansible.cfg of its own (``config``: more [defaults] lines); return the finished process, failed or not."""
    import os
    import subprocess

    import yaml

    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    (tmp / "ansible.cfg").write_text(f"[defaults]\nstdout_callback = ansible.builtin.default\n{config}")
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", inventory, str(tmp / "play.yml"),
         "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "ANSIBLE_CONFIG": str(tmp / "ansible.cfg")},
    )  # fmt: skip


def run_playbook(tmp: Path, play: list, inventory: str = "localhost,", config: str = "") -> None:
    """:func:`ansible_playbook`, failing the test with the output's end when the play fails."""
    result = ansible_playbook(tmp, play, inventory, config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def changed_tasks(result) -> list[str]:
    """The names of the tasks that reported a change, from ansible-playbook's ``json`` stdout callback."""
    import json

    report = json.loads(result.stdout)
    return [
        task["task"]["name"]
        for play in report["plays"]
        for task in play["tasks"]
        if any(host.get("changed") for host in task["hosts"].values())
    ]
