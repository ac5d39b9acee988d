"""scripts/system-packages.sh (the first step of `make up` and of `make test`) installs only what is missing, judged by
the real dpkg-query against a dpkg database written here (DPKG_ADMINDIR, dpkg-query(1)): a package held by `make up`'s
docker role is installed, one removed with its configuration left is not. apt-get and sudo are recorders on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dinops_testing import REPO

SCRIPT = REPO / "scripts" / "system-packages.sh"


def _stanza(package: str, status: str) -> str:
    return (f"Package: {package}\nStatus: {status}\nPriority: optional\nSection: misc\nInstalled-Size: 1\n"
            "Maintainer: test <test@example.org>\nArchitecture: all\nVersion: 1.0\nDescription: test\n\n")  # fmt: skip


def _run(tmp_path: Path, statuses: dict[str, str]) -> tuple[subprocess.CompletedProcess, str]:
    if shutil.which("dpkg-query") is None:
        pytest.fail("this test needs dpkg-query (Debian's dpkg)")
    admin = tmp_path / "dpkg"
    (admin / "info").mkdir(parents=True)
    (admin / "updates").mkdir()
    (admin / "status").write_text("".join(_stanza(name, status) for name, status in statuses.items()))
    (admin / "available").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for tool in ("apt-get", "sudo"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >>{calls}\n')
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "DPKG_ADMINDIR": str(admin), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(SCRIPT), "controller"], env=env, capture_output=True, text=True, timeout=60)
    return done, calls.read_text() if calls.exists() else ""


def test_a_held_package_counts_as_installed(tmp_path):
    """The docker role holds docker.io; `hold ok installed` once read as missing, and each `make test` after a
    `make up` on the same machine ran apt-get update and install again."""
    done, calls = _run(tmp_path, {"python3-venv": "hold ok installed", "git": "install ok installed"})
    assert done.returncode == 0, done.stderr
    assert calls == ""
    assert done.stdout == ""


def test_what_is_absent_or_only_configured_is_installed_and_nothing_else(tmp_path):
    done, calls = _run(tmp_path, {"python3-venv": "deinstall ok config-files"})
    assert done.returncode == 0, done.stderr
    assert "installing system packages: python3-venv git" in done.stdout
    installs = [line for line in calls.splitlines() if " install " in f" {line} "]
    assert len(installs) == 1 and installs[0].endswith(" python3-venv git"), calls
    assert any(" update" in line for line in calls.splitlines()), calls
