"""Rendered manifests, shared by the schema and policy tests: each overlay is rendered once per session."""

from __future__ import annotations

import pytest
from k8s.k8s_render import K8S, OVERLAYS, SITE_VARIANTS, kustomize, render_site


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    return {overlay: kustomize(K8S / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="session")
def rendered_sites(tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("sites")
    return {name: render_site(root, name, settings) for name, settings in SITE_VARIANTS.items()}
