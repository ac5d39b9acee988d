"""The controller's Python on hosts whose own is too old (Ubuntu 20.04: 3.8, 22.04: 3.10).

scripts/controller-python.sh picks the Python >= 3.11 that `make up` builds the controller venv from, or has uv
install one. Here it runs on PATHs of fake interpreters (the real one, told to report another version) and a fake
uv, so nothing is downloaded. The other way out, a controller elsewhere, works because ansible-core 2.19 manages
targets with Python 3.8: the last test runs preflight's tasks through a real Python 3.8 when this machine has one.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dinops_testing import REPO

SCRIPT = REPO / "scripts" / "controller-python.sh"


def fake_python(bin_dir: Path, name: str, version: tuple[int, int], venv: bool = True) -> Path:
    """`name` in bin_dir: this test's interpreter, reporting `version` (and no ensurepip when venv is False)."""
    site = bin_dir / f"{name}.site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"sys.version_info = ({version[0]}, {version[1]}, 0, 'final', 0)\n"
        f"sys.executable = {str(bin_dir / name)!r}\n" + ("" if venv else "sys.modules['ensurepip'] = None\n")
    )
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


FAKE_UV = """#!/bin/sh
# uv as far as controller-python.sh uses it: `python find` answers once `python install` has run.
echo "$*" >> {log}
case "$1 $2" in
  "python find") [ -e {installed} ] && echo {managed} || exit 2 ;;
  "python install") [ -z "$FAKE_UV_FAIL" ] || {{ echo "error: Failed to download" >&2; exit 1; }}; : > {installed} ;;
esac
"""


class FakeHost:
    """bin/ for the host's interpreters (none yet) and a uv that installs CPython 3.11 into managed/."""

    def __init__(self, path: Path):
        self.path = path
        self.bin = path / "bin"
        self.bin.mkdir()
        # The script needs dirname from PATH; nothing else of this machine's PATH, whose pythons would answer.
        os.symlink(shutil.which("dirname"), self.bin / "dirname")
        self.managed = fake_python(path / "managed", "python3.11", (3, 11))
        self.uv = path / "uv"
        self.uv.write_text(FAKE_UV.format(log=path / "uv.log", installed=path / "installed", managed=self.managed))
        self.uv.chmod(0o755)

    def python(self, name: str, version: tuple[int, int], venv: bool = True) -> Path:
        return fake_python(self.bin, name, version, venv)

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["/bin/bash", str(SCRIPT), *args],
            env={"PATH": str(self.bin), "UV": str(self.uv), "HOME": str(self.path), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def uv_calls(self) -> list[str]:
        log = self.path / "uv.log"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def host(tmp_path) -> FakeHost:
    return FakeHost(tmp_path)


def test_the_newest_python_on_path_wins_and_uv_is_not_asked(host):
    host.python("python3", (3, 8))
    newest = host.python("python3.12", (3, 12))
    host.python("python3.11", (3, 11))
    proc = host.run()
    assert (proc.returncode, proc.stdout.strip()) == (0, str(newest)), proc.stderr
    assert host.uv_calls() == []


def test_debian_12_python3_is_taken_as_it_is(host):
    python3 = host.python("python3", (3, 11))
    proc = host.run()
    assert proc.stdout.strip() == str(python3)
    assert host.uv_calls() == []


def test_ubuntu_20_04_gets_cpython_3_11_from_uv(host):
    host.python("python3", (3, 8))
    host.python("python3.11", (3, 11), venv=False)  # python3.11 without python3.11-venv cannot make the venv
    proc = host.run()
    assert (proc.returncode, proc.stdout.strip()) == (0, str(host.managed)), proc.stderr
    assert "python install --no-bin 3.11" in host.uv_calls()
    # A second run finds the installed one and installs nothing.
    again = host.run()
    assert again.stdout == proc.stdout
    assert [call for call in host.uv_calls() if call.startswith("python install")] == ["python install --no-bin 3.11"]


def test_a_failed_download_stops_with_what_to_run(host):
    host.python("python3", (3, 10))
    proc = host.run(FAKE_UV_FAIL="1")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "uv could not install CPython 3.11" in proc.stderr
    for way_out in ("make up UV_PYTHON_INSTALL_MIRROR=", "make up PYTHON=", "make up INVENTORY="):
        assert way_out in proc.stderr


def test_python_given_is_checked_and_beats_path(host):
    host.python("python3.12", (3, 12))
    old = fake_python(host.path / "elsewhere", "python3.8", (3, 8))
    chosen = fake_python(host.path / "elsewhere", "python3.11", (3, 11))
    assert host.run(str(chosen)).stdout.strip() == str(chosen)
    proc = host.run(str(old))
    assert proc.returncode == 2
    assert f"PYTHON={old} is not a Python >= 3.11" in proc.stderr


def test_make_hands_python_to_the_script_only_when_the_venv_cannot_serve():
    proc = subprocess.run(
        ["make", "-n", "-B", ".venv/.controller", "PYTHON=/opt/python3.12"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    recipe = proc.stdout
    assert "sys.version_info < (3, 11)" in recipe
    assert "scripts/controller-python.sh /opt/python3.12" in recipe
    assert "-m venv --clear .venv" in recipe


def python_3_8() -> str | None:
    """A Python 3.8 interpreter on this machine (Ubuntu 20.04's), from PATH or pyenv."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for candidate in [shutil.which("python3.8"), *sorted(glob.glob(f"{pyenv}/versions/3.8.*/bin/python3.8"))]:
        if candidate:
            probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
            if probe.returncode == 0 and probe.stdout.strip() == b"(3, 8)":
                return candidate
    return None


TARGET_PLAYBOOK = """
- name: Preflight's fact gathering on a target whose Python is 3.8
  hosts: old_python_target
  gather_facts: true
  tasks:
    - name: Run the preflight role's OS and hardware checks
      ansible.builtin.include_role:
        name: preflight
        tasks_from: "{{ item }}"
      loop: [os.yml, hardware.yml]
    - name: Show what ran the modules and what preflight measured
      ansible.builtin.debug:
        msg: >-
          modules ran on Python {{ ansible_facts['python']['version']['major'] }}.{{
          ansible_facts['python']['version']['minor'] }}; preflight measured {{ __preflight_host['memory_mb'] }} MB
"""


def test_ansible_core_manages_a_target_with_python_3_8(ansible_env, tmp_path):
    python = python_3_8()
    if python is None:
        pytest.skip("no Python 3.8 on this machine (PATH or pyenv) to stand for Ubuntu 20.04's")
    playbook = tmp_path / "old_target.yml"
    playbook.write_text(TARGET_PLAYBOOK)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"old_python_target ansible_connection=local ansible_python_interpreter={python}\n")
    # Facts of this run stay out of the project's fact cache (.cache/ansible-facts) that `make up` reads.
    env = dict(ansible_env, ANSIBLE_CACHE_PLUGIN="ansible.builtin.memory")
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(playbook)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "modules ran on Python 3.8; preflight measured" in proc.stdout, proc.stdout
