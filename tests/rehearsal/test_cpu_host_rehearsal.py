"""The CPU-host rehearsal: the README's `make up` from a fresh clone on a look-alike of a fresh Debian 12 VM with
systemd and no GPU, as the cloud image's sudoer, to the first correct detection; then a second `make up` changes
nothing. The newcomer stage runs the same `make up` on a host without systemd; this one is the common case of a rented
VM, where the docker role installs Docker from the distribution and systemd starts and enables it.

The host: a systemd container (`dinops-cpu-host`) of the Molecule platform image with Docker-in-Docker's capabilities
(rehearsal/instance.py), not --privileged, hostname `cpu-vm`. No Docker installed, nothing listening, no `.venv`; the
package lists of the image as built. The user is the one of Debian's cloud images, `admin`, a sudoer without a
password (cloud-init's `sudo: ALL=(ALL) NOPASSWD:ALL`), who installs git and make as the README's quick start says and
runs `make up` in a login shell in the clone. The inventory is inventories/local as it is, plus one setting: a
controller without kubectl downloads it from dl.k8s.io for its kustomize (the workloads role), out of reach here, so
workloads_kubectl_url names a mirror in the instance holding this machine's kubectl 1.33 binary and its .sha256, the
way an air-gapped site points the role at its own copy.

What is not from nothing: the images. Built in the instance, they would take the 14 minutes the README states for a
first run, so the instance's Docker storage (/var/lib/docker: a volume on this machine's disk, where the inner daemon
gets overlay2 instead of vfs) holds the images `make test`'s images stage built on this machine before `make up`
(the same content-hash tags, which the images role looks up), hard-linked from this machine's store (`_seed`). The
docker role then installs docker.io onto that storage, as on a VM whose disk kept /var/lib/docker. The images
stage's build is the same function as here (tests/images/imagetools.py), under one lock: whichever stage comes first
builds, the other finds every tag.

Checks: `make up` ends green and prints the client's URL; Docker is the distribution's, active and enabled under
systemd (it comes back after a reboot), the demo's containers run on it; a validation image's shape is found through
the client's API on the instance's loopback (tests/newcomer/first_detection.py run there); a second `make up`
changes nothing (changed=0) and leaves the containers as they were; the clone stays the user's.

Marked ``cpu_rehearsal`` (`make cpu-rehearsal`). Outputs in artifacts/cpu-host-make-up-{1,2}.log, the times in
artifacts/cpu-host.json and printed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from images.imagetools import build_every_image, load_build
from rehearsal.instance import ARTIFACTS, Instance, recap

from dinops_testing import REPO

pytestmark = [pytest.mark.cpu_rehearsal, pytest.mark.timeout(3600)]

VOLUME = "dinops-cpu-host-docker"
# A kubectl release binary of this machine's (Google Cloud SDK's kubectl.1.33 is kubectl itself, not its dispatcher).
KUBECTL = Path("/usr/lib/google-cloud-sdk/bin/kubectl.1.33")
MIRROR = "/srv/dinops-mirror/kubectl/bin/linux/amd64"
HOST_VARS = b"""---
# The CPU-host rehearsal's mirror of dl.k8s.io (tests/rehearsal/test_cpu_host_rehearsal.py).
workloads_kubectl_url: file:///srv/dinops-mirror/kubectl/bin/linux/{arch}/kubectl
"""
VM = Instance(
    "dinops-cpu-host", hostname="cpu-vm", mounts=(f"{VOLUME}:/var/lib/docker", f"{KUBECTL}:{MIRROR}/kubectl:ro")
)
USER = "admin"  # Debian's cloud images (AWS, genericcloud)
CLONE = f"/home/{USER}/dinops"
DATA = "/var/lib/dinops/volumes"
CONTAINERS = ("dinops-download", "dinops-train", "dinops-serve", "dinops-client", "dinops-prometheus")
FIRST_DETECTION = Path(__file__).resolve().parents[1] / "newcomer" / "first_detection.py"
TIMES: dict[str, float] = {}


def _images() -> list[str]:
    """The images `make up` looks up on this host: the air-gapped base and every step of the plan, built here first
    when missing."""
    build = load_build()
    steps, _, _ = build_every_image(build, REPO / "build" / "wheelhouse", REPO / "build" / "image-logs")
    return [build.AIRGAP_BASE, *(step.image for step in steps)]


def _seed(images: list[str]) -> None:
    """The images into the instance's /var/lib/docker (the volume, on this machine's disk) as Docker's overlay2 store
    holds them, hard-linked from this machine's store instead of copied: the image configs and the layers' metadata
    (image/overlay2/{imagedb,layerdb}, repositories.json with the tags), and each layer's directory (overlay2/<cache
    id>, its files hard links, read-only to both daemons: image layers are only ever read and unlinked) with its
    short link (overlay2/l). `docker save | docker load` of the same 6 GB took 4 minutes here; this takes seconds.
    Docker 20.10's layout (moby's daemon/graphdriver/overlay2 and layer/layer_store.go): a layer's chain ID is its
    diff ID for the first, sha256("<parent chain ID> <diff ID>") after."""
    info = json.loads(subprocess.run(["docker", "info", "--format", "{{json .}}"], capture_output=True, text=True,
                                     check=True).stdout)  # fmt: skip
    assert info["Driver"] == "overlay2", f"this machine's Docker stores images with {info['Driver']}, not overlay2"
    source = Path(info["DockerRootDir"])
    mountpoint = subprocess.run(["docker", "volume", "inspect", "--format", "{{.Mountpoint}}", VOLUME],
                                capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    target = Path(mountpoint)
    meta = Path("image/overlay2")
    for directory in (meta / "imagedb/content/sha256", meta / "layerdb/sha256", Path("overlay2/l")):
        (target / directory).mkdir(parents=True, exist_ok=True)
    repositories: dict[str, dict[str, str]] = {}
    for ref in images:
        image_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True,
                                  text=True, check=True).stdout.strip()  # fmt: skip
        repositories.setdefault(ref.rsplit(":", 1)[0], {})[ref] = image_id
        config = meta / "imagedb/content/sha256" / image_id.removeprefix("sha256:")
        shutil.copy2(source / config, target / config)
        chain = ""
        for diff_id in json.loads((source / config).read_text())["rootfs"]["diff_ids"]:
            chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest() if chain else diff_id
            layer = meta / "layerdb/sha256" / chain.removeprefix("sha256:")
            if (target / layer).exists():
                continue
            shutil.copytree(source / layer, target / layer)
            cache = Path("overlay2") / (source / layer / "cache-id").read_text().strip()
            subprocess.run(["cp", "-al", str(source / cache), str(target / cache)], check=True)
            link = (source / cache / "link").read_text().strip()
            (target / "overlay2/l" / link).symlink_to(f"../{cache.name}/diff")
    (target / meta / "repositories.json").write_text(json.dumps({"Repositories": repositories}))


def _make_up(n: int) -> dict:
    run = VM.make_up(USER, CLONE, f"cpu-host-make-up-{n}.log", timeout=1800)
    TIMES[f"make up #{n}"] = run["seconds"]
    print(f"\ncpu host: make up #{n}: exit {run['rc']} in {run['seconds']:.0f} s")
    return run


def _inspect(name: str) -> dict:
    return json.loads(VM.out(f"docker inspect {name}"))[0]


@pytest.fixture(scope="module")
def first_run():
    if not KUBECTL.is_file():
        pytest.fail(f"{KUBECTL} (a kubectl release binary for the instance's mirror of dl.k8s.io) is missing")
    began = time.monotonic()
    images = _images()
    TIMES["images on this machine"] = time.monotonic() - began
    subprocess.run(["docker", "volume", "rm", "-f", VOLUME], capture_output=True, check=False)
    subprocess.run(["docker", "volume", "create", VOLUME], capture_output=True, check=True)
    try:
        seeded = time.monotonic()
        _seed(images)
        TIMES["image store filled"] = time.monotonic() - seeded
        VM.start()
        assert VM.run("command -v docker dockerd", check=False).returncode != 0, "Docker in the image already"
        VM.pip_trusts_the_proxy()
        VM.run(f"cd {MIRROR} && sha256sum kubectl | cut -d' ' -f1 > kubectl.sha256")
        VM.cloud_user(USER)
        # The quick start's first line on a minimal image, then the clone.
        VM.run(f"su - {USER} -c 'sudo apt-get update -qq && sudo apt-get install -y -qq git make >/dev/null'")
        cloned = time.monotonic()
        VM.clone(USER, CLONE, {"inventories/local/host_vars/localhost.yml": HOST_VARS})
        run = _make_up(1)
        output = run["output"]
        assert run["rc"] == 0, output[-6000:]
        assert recap(output)["failed"] == 0
        detection = VM.run(f"python3 - {DATA} http://127.0.0.1:30000 1200", data=FIRST_DETECTION.read_bytes(),
                           check=False, timeout=1500)  # fmt: skip
        assert detection.returncode == 0, detection.stderr.decode()[-3000:] + VM.out(
            "for c in " + " ".join(CONTAINERS) + '; do echo "--- $c"; docker logs --tail 15 $c 2>&1; done'
        )
        TIMES["clone to first detection"] = time.monotonic() - cloned
        found = json.loads(detection.stdout)
        print(f"cpu host: clone to the first correct detection: {TIMES['clone to first detection']:.0f} s ({found})")
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "cpu-host.json").write_text(json.dumps({**{k: round(v) for k, v in TIMES.items()},
                                                              "detection": found}, indent=2))  # fmt: skip
        yield run
    finally:
        VM.remove()
        subprocess.run(["docker", "volume", "rm", "-f", VOLUME], capture_output=True, check=False)
        print("\ncpu host: " + ", ".join(f"{step} {seconds:.0f} s" for step, seconds in TIMES.items()))


@pytest.fixture(scope="module")
def second_run(first_run):
    before = {name: _inspect(name) for name in CONTAINERS}
    return {**_make_up(2), "before": before}


def test_make_up_serves_the_demo_on_docker_started_by_systemd(first_run):
    assert "Web client: http://" in first_run["output"] and ":30000/" in first_run["output"]
    # The images were found by their content-hash tags, none built (a build here would take the run's time away).
    assert "TASK [images : build | Build the image]" not in first_run["output"]
    assert VM.out("systemctl is-active docker").strip() == "active"
    assert VM.out("systemctl is-enabled docker").strip() == "enabled"
    # The distribution's package, held by the docker role (install.yml: the pinned version stays).
    assert VM.out("dpkg-query -W -f '${Status}' docker.io") == "hold ok installed"
    for name in CONTAINERS:
        labels = _inspect(name)["Config"]["Labels"]
        assert labels["dinops.io/runtime"] == "docker" and labels["app.kubernetes.io/part-of"] == "dinops", name
    client = _inspect("dinops-client")["NetworkSettings"]["Ports"]["8080/tcp"]
    assert {(b["HostIp"], b["HostPort"]) for b in client} == {("127.0.0.1", "30000")}, client


def test_a_second_make_up_changes_nothing(second_run):
    assert second_run["rc"] == 0, second_run["output"][-4000:]
    assert recap(second_run["output"])["changed"] == 0, [
        line for line in second_run["output"].splitlines() if line.startswith("changed:")
    ]
    for name, before in second_run["before"].items():
        after = _inspect(name)
        assert (after["Id"], after["RestartCount"]) == (before["Id"], before["RestartCount"]), name


def test_the_clone_stays_the_users(second_run):
    foreign = VM.out(f"find {CLONE} -not -user {USER} -printf '%u %p\\n' | head -n 20")
    assert not foreign, f"files in the clone not owned by {USER}:\n{foreign}"
