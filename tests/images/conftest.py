"""Fixtures of the image tests: every image built once per session in air-gapped mode (as CI does), a Docker
helper that removes what it created, and host directories the images' user may write."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from images.imagetools import APP_UID, REPO, Docker, build_every_image, load_build


@pytest.fixture(scope="session")
def docker():
    helper = Docker()
    if helper("info", check=False).returncode != 0:
        pytest.fail("no Docker daemon answers: run `make docker` (scripts/ensure-docker.sh) first")
    yield helper
    helper.cleanup()


@pytest.fixture(scope="session")
def build(tmp_path_factory):
    """apps/images/build.py, working on a snapshot of the build context taken with its own `archive` (what the
    images role ships to build hosts): the session's images and plans stay consistent while apps/ is edited."""
    module = load_build()
    snapshot = tmp_path_factory.mktemp("context")
    module.archive(snapshot / "context.tar")
    with tarfile.open(snapshot / "context.tar") as tar:
        tar.extractall(snapshot / "apps", filter="data")
    module.CONTEXT = snapshot / "apps"
    module.IMAGES_DIR = snapshot / "apps" / "images"
    return module


@pytest.fixture(scope="session")
def images(docker, build) -> dict[str, str]:
    """Build every image (air-gapped: Debian base, wheelhouse over loopback) unless its content-hash tag exists.

    Returns image name -> tag. Build times go to build/image-logs/timings.json (printed by `make bench`).
    """
    wheelhouse = REPO / "build" / "wheelhouse"
    logs = REPO / "build" / "image-logs"
    start = time.monotonic()
    try:
        steps, timings, pruned = build_every_image(build, wheelhouse, logs)
    except (build.BuildError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"image build failed: {exc}")
    record = {"total_s": round(time.monotonic() - start, 1), "images": timings, "pruned": pruned}
    (logs / "timings.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return {s.name: s.image for s in steps}


@pytest.fixture
def owned_dir(tmp_path):
    """A host directory the images' unprivileged user may write (bind-mounted into containers)."""

    def make(name: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        os.chown(path, APP_UID, APP_UID)
        return path

    return make
