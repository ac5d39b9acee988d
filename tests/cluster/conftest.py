"""Load the roles' filter plugins from their files, as Ansible does (they are not an importable package)."""

from __future__ import annotations

import pytest

import dinops_testing


def load_plugin(role: str, name: str):
    return dinops_testing.load_plugin(f"roles/{role}/filter_plugins/{name}.py")


@pytest.fixture(scope="session")
def minikube_decision():
    return load_plugin("minikube", "minikube_decision")
