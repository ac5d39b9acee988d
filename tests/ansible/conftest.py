"""Fixtures for the Ansible tests: the repository's ansible-* commands with the project's configuration."""

from __future__ import annotations

import os
import sys

import pytest

from dinops_testing import REPO

VENV_BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="session")
def ansible_env() -> dict[str, str]:
    """Environment for ansible-* commands run from the repository root with the project's ansible.cfg."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env.pop("ANSIBLE_INVENTORY", None)
    return env
