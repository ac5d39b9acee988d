"""Rendered manifests, shared by the schema and policy tests: each overlay is rendered once per session."""

from __future__ import annotations

import fcntl
import json

import pytest
from k8s.k8s_render import K8S, OVERLAYS, SITE_VARIANTS, kustomize, render_site


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    return {overlay: kustomize(K8S / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="session")
def rendered_sites(tmp_path_factory, worker_id) -> dict[str, list[dict]]:
    """Every site variant rendered, once per run: under pytest-xdist the first worker that asks renders them (about
    35 s here) and the others read its JSON, waiting on a lock in the run's shared temporary directory."""
    root = tmp_path_factory.mktemp("sites")
    if worker_id == "master":  # not distributed
        return {name: render_site(root, name, settings) for name, settings in SITE_VARIANTS.items()}
    shared = tmp_path_factory.getbasetemp().parent / "rendered-sites.json"
    with shared.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shared.exists():
            return json.loads(shared.read_text())
        sites = {name: render_site(root, name, settings) for name, settings in SITE_VARIANTS.items()}
        written = shared.with_suffix(".tmp")
        written.write_text(json.dumps(sites))
        written.replace(shared)
        return sites
