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
