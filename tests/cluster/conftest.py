"""Load the roles' filter plugins from their files, as Ansible does (they are not an importable package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_plugin(role: str, name: str):
    path = REPO / "roles" / role / "filter_plugins" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"dinops_{role}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def minikube_decision():
    return load_plugin("minikube", "minikube_decision")
