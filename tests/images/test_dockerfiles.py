"""Static checks of apps/images (no Docker needed): every environment variable the Dockerfiles name is one the apps
read, and the torch image installs exactly the `model` extra of apps/pyproject.toml."""

from __future__ import annotations

import re

import pytest
import tomllib
from images.imagetools import REPO

IMAGES = REPO / "apps" / "images"
APP_VARIABLE = re.compile(r"\b(?:DINO|CLIENT|DOWNLOAD)_[A-Z0-9_]+\b")


def _settings_env() -> set[str]:
    from dinops.client.settings import SETTINGS as client
    from dinops.download.settings import SETTINGS as download
    from dinops.serve.settings import SETTINGS as serve
    from dinops.train.settings import SETTINGS as train

    return {s.env for table in (serve, client, download, train) for s in table if s.env}


@pytest.mark.parametrize("dockerfile", sorted(p.name for p in IMAGES.glob("*.Dockerfile")))
def test_app_variables_in_dockerfiles_are_settings(dockerfile):
    text = (IMAGES / dockerfile).read_text()
    named = set(APP_VARIABLE.findall(text))
    assert named <= _settings_env(), f"{dockerfile} names unknown settings {sorted(named - _settings_env())}"


def test_healthchecks_and_defaults_use_the_apps_settings():
    assert "DINO_BIND" in (IMAGES / "serve.Dockerfile").read_text()
    assert "CLIENT_BIND" in (IMAGES / "client.Dockerfile").read_text()
    assert "ENV DOWNLOAD_DEST=/data/coco" in (IMAGES / "download.Dockerfile").read_text()


def test_torch_image_installs_the_model_extra():
    with (REPO / "apps" / "pyproject.toml").open("rb") as f:
        model = tomllib.load(f)["project"]["optional-dependencies"]["model"]
    install = re.search(r"--constraint \S+ ([a-z ]+?)\s*\\", (IMAGES / "torch.Dockerfile").read_text())
    assert install and sorted(install.group(1).split()) == sorted(model)
