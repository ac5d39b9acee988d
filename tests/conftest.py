"""Repository-level tests: Ansible plugins, inventories, playbooks and manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from dinops_testing import REPO


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
