"""What every image is, without starting its application: metadata, shared PyTorch layer, sizes, installed set."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from images.imagetools import REPO

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]

APPS = ("serve", "train", "gpu-check", "client", "download")
SERVICES = ("serve", "client")
SMALL_LIMIT_BYTES = 150 * 10**6
# Run inside each image: the facts the assertions below need, as one JSON object. Suspects are archives left by a
# build (wheels, except Debian's own /usr/share/python-wheels that `python3 -m venv` needs; tarballs outside the
# packages' data) and anything weight-sized.
PROBE = r"""
import importlib.metadata, importlib.util, json, os, shutil
facts = {
    "uid": os.getuid(),
    "recorded": open("/usr/share/dinops/installed.txt").read().split(),
    "installed": [f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()],
    "tools": [t for t in ("gcc", "cc", "c++", "g++", "make", "ld", "git") if shutil.which(t)],
    "leftovers": [p for p in ("/src", "/stage", "/root/.cache/pip", "/home/dinops/.cache") if os.path.exists(p)],
    "torch": importlib.util.find_spec("torch") is not None,
    "suspects": [],
}
for top in ("/opt", "/usr", "/home", "/srv", "/root", "/tmp", "/var"):
    for root, _, files in os.walk(top):
        if root.startswith("/usr/share/python-wheels"):
            continue
        for f in files:
            path = os.path.join(root, f)
            if f.endswith(".whl") or (f.endswith(".tar.gz") and "site-packages" not in root) or (
                f.endswith((".pth", ".pt", ".ckpt", ".safetensors")) and os.path.getsize(path) > 100_000
            ):
                facts["suspects"].append(path)
print(json.dumps(facts))
"""


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "apps" / "constraints.txt").read_text().split():
        name, _, version = line.partition("==")
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


@pytest.fixture(scope="module")
def inspected(images, docker) -> dict[str, dict]:
    return {name: docker.inspect(tag) for name, tag in images.items()}


@pytest.fixture(scope="module")
def probed(images, docker) -> dict[str, dict]:
    facts = {}
    for name in APPS:
        out = docker("run", "--rm", "--read-only", "--entrypoint", "python3", images[name], "-c", PROBE).stdout
        facts[name] = json.loads(out)
    return facts


def test_second_build_is_a_no_op(build, images, tmp_path):
    steps = build.plan(build.AIRGAP_BASE)
    assert {s.name: s.image for s in steps} == images
    assert build.build(steps, None, tmp_path) == dict.fromkeys(images)  # None: already there, nothing built


@pytest.mark.parametrize("name", APPS)
def test_metadata(name, images, inspected):
    config = inspected[name]["Config"]
    labels = config["Labels"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"][:2] == ["/usr/bin/tini", "--"]
    assert labels["org.opencontainers.image.title"] == f"dinops-{name}"
    assert labels["org.opencontainers.image.version"] == images[name].split(":")[1].split("-")[0] == "0.1.0"
    assert labels["org.opencontainers.image.source"].strip()
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", labels["org.opencontainers.image.revision"])
    assert labels["org.dinops.content-hash"] == images[name].rsplit("-", 1)[1]
    if name in SERVICES:
        assert config["Healthcheck"]["Test"][0] == "CMD"
        assert "/healthz" in config["Healthcheck"]["Test"][-1]
    else:
        assert config.get("Healthcheck") is None


def test_pytorch_layer_is_shared(images, inspected):
    torch_layers = inspected["torch"]["RootFS"]["Layers"]
    runtime_layers = inspected["runtime"]["RootFS"]["Layers"]
    assert torch_layers[: len(runtime_layers)] == runtime_layers
    for name in ("serve", "train", "gpu-check"):
        layers = inspected[name]["RootFS"]["Layers"]
        assert layers[: len(torch_layers)] == torch_layers, name
        assert len(layers) - len(torch_layers) == 1, f"{name}: one layer of its own, the staged install"


@pytest.mark.parametrize("name", ["client", "download"])
def test_small_images_without_torch(name, inspected, probed):
    assert inspected[name]["Size"] <= SMALL_LIMIT_BYTES, f"{name}: {inspected[name]['Size'] / 1e6:.0f} MB"
    assert probed[name]["torch"] is False


@pytest.mark.parametrize("name", APPS)
def test_installed_set_recorded_pinned_and_nothing_else_inside(name, probed):
    facts = probed[name]
    assert facts["uid"] == 10001
    recorded = set(facts["recorded"])
    assert "dinops==0.1.0" in recorded
    assert recorded == set(facts["installed"])
    pins = _constraints()
    for line in recorded - {"dinops==0.1.0"}:
        package, _, version = line.partition("==")
        key = re.sub(r"[-_.]+", "-", package).lower()
        if key in pins:
            assert version == pins[key], f"{name}: {line} but constraints pin {pins[key]}"
        else:
            assert key in {"pip", "setuptools", "wheel"}, f"{name}: {line} is not pinned by apps/constraints.txt"
    assert facts["torch"] is (name in ("serve", "train", "gpu-check"))
    assert facts["tools"] == []
    assert facts["leftovers"] == []
    assert facts["suspects"] == []


def _build_from(parent: str, tag: str, marker: str) -> str:
    """A one-line image on ``parent`` (it inherits the content-hash label, as a build stage does); returns its ID."""
    dockerfile = f"FROM {parent}\nLABEL org.dinops.test-marker={marker}\n"
    subprocess.run(["docker", "build", "--quiet", "--tag", tag, "-"], input=dockerfile, text=True, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def test_prune_frees_older_builds_and_keeps_current_and_used_images(build, images, docker):
    repository = images["client"].split(":")[0]
    stale_tag = f"{repository}:0.1.0-{'0' * 16}"
    docker("tag", images["client"], stale_tag)
    scratch = f"{docker.prefix}-prune:1"
    held = _build_from(images["client"], scratch, "held")
    holder = docker.name("container", "prune-holder")
    docker("create", "--name", holder, held)
    superseded = _build_from(images["client"], scratch, "superseded")  # `held` is now dangling, but in use
    current_scratch = _build_from(images["client"], scratch, "current")  # `superseded` is dangling and unused
    try:
        removed = build.prune(build.plan(build.AIRGAP_BASE))
        assert stale_tag in removed and superseded in removed
        assert held not in removed and current_scratch not in removed
        assert docker("image", "inspect", stale_tag, check=False).returncode != 0
        assert docker("image", "inspect", superseded, check=False).returncode != 0
        assert docker("image", "inspect", held, check=False).returncode == 0  # a container still uses it
        for image in images.values():
            assert docker("image", "inspect", image, check=False).returncode == 0, f"{image} was removed"
        assert build.prune(build.plan(build.AIRGAP_BASE)) == []  # nothing left to free
    finally:
        docker("rm", "-f", holder, check=False)
        docker("image", "rm", "-f", scratch, held, check=False)
