"""Repository-level tests: Ansible plugins, inventories, playbooks and manifests."""

from __future__ import annotations

import functools
from pathlib import Path

import kubernetes_validate.utils
import pytest

from dinops_testing import REPO

# kubernetes-validate 1.37.0 reads the kind's schema and the version's _definitions.json (1.3 MB) from disk and
# parses them again on every validate() (utils.validate -> schema_contents); the manifest tests validate
# thousands of objects against a few dozen files. Read once per file and process (validate() does not change what it
# reads): 14 ms -> 1.7 ms an object on the build machine.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
