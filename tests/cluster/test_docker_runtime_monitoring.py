"""Prometheus on the Docker runtime finds the trainer by the headless Service's name, for real.

The demo layer is rendered and translated (roles/workloads/filter_plugins/docker_runtime.py) as the role does; on this
machine's Docker, on a network of the test's own:
- the trainer: the real dinops-train image serving the real MetricsServer on 9109 (all addresses, as `dinops train`),
  with exactly the network aliases the plan gives the dinops-train container (dinops-train-metrics);
- Prometheus: the real dinops-prometheus image run as the plan's dinops-prometheus container says (its command, user,
  read-only root, dropped capabilities, the rendered ConfigMap's files mounted at /etc/prometheus, its TSDB directory).
Prometheus' DNS discovery resolves the short name through Docker's embedded DNS (prometheus.yml; v2.42.0
discovery/dns/dns.go lookupWithSearchPath) and scrapes the trainer: job dinops-train's target is up at the trainer
container's address, read from inside the container as the validator reads it (docker exec, python3).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from k8s.k8s_render import DOCKER_VARIANTS, render_site

from dinops_testing import load_plugin

DOCKER = load_plugin("roles/workloads/filter_plugins/docker_runtime.py")
IMAGES = ("dinops-prometheus:0.1.0", "dinops-train:0.1.0")
TRAINER = (
    "import time\n"
    "from dinops.train.metrics import MetricsServer, TrainMetrics\n"
    "MetricsServer(TrainMetrics('/tmp'), 9109)\n"
    "time.sleep(600)\n"
)
TARGETS = (
    "import json, urllib.request\n"
    "print(json.dumps(json.load(urllib.request.urlopen('http://127.0.0.1:9090/api/v1/targets', timeout=5))))\n"
)


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def docker_images():
    if shutil.which("docker") is None or _docker("info", check=False).returncode != 0:
        pytest.fail("no Docker daemon answers: run scripts/ensure-docker.sh first")
    missing = [image for image in IMAGES if _docker("image", "inspect", image, check=False).returncode != 0]
    if missing:
        pytest.skip(f"images not built on this machine: {missing} (the images stage, apps/images/build.py)")


def _run_args(container: dict, name: str) -> list[str]:
    """docker run options for the plan's container, as community.docker.docker_container applies them."""
    args = ["--detach", "--name", name, "--user", container["user"]]
    if container["read_only"]:
        args.append("--read-only")
    args += [f"--cap-drop={cap}" for cap in container.get("cap_drop", [])]
    args += [f"--security-opt={opt}" for opt in container.get("security_opts", [])]
    for mount in container["mounts"]:
        if mount["type"] == "bind":
            spec = f"type=bind,source={mount['source']},target={mount['target']}"
            args.append("--mount=" + spec + (",readonly" if mount["read_only"] else ""))
        else:
            args.append(f"--mount=type={mount['type']},target={mount['target']}")
    return args


def test_prometheus_finds_and_scrapes_the_trainer_by_its_alias(tmp_path, docker_images):
    objects = render_site(tmp_path / "layer", "demo", DOCKER_VARIANTS["docker-cpu-demo"])
    suffix = secrets.token_hex(4)
    network = f"dinops-test-{suffix}"
    data_dir = tmp_path / "volumes"
    plan = DOCKER.docker_plan(objects, {"data_dir": str(data_dir), "network": network})
    containers = {c["name"]: c for c in plan["containers"]}
    # The files and the TSDB directory, as docker_files.yml and docker_host.yml make them.
    for item in plan["files"]:
        path = Path(item["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o755)
        path.write_text(item["content"])
        path.chmod(0o644)
    for directory in plan["directories"]:
        Path(directory["path"]).mkdir(parents=True, exist_ok=True)
        os.chown(directory["path"], directory["owner"], directory["group"])
        Path(directory["path"]).chmod(0o2775)
    for parent in (tmp_path, data_dir):
        parent.chmod(0o755)
    prometheus, train = containers["dinops-prometheus"], containers["dinops-train"]
    aliases = train["networks"][0]["aliases"]
    assert aliases == ["dinops-train-metrics"]
    names = {"train": f"dinops-test-train-{suffix}", "prometheus": f"dinops-test-prometheus-{suffix}"}
    _docker("network", "create", network)
    try:
        _docker("run", "--detach", "--name", names["train"], "--network", network,
                *[f"--network-alias={a}" for a in aliases], "--entrypoint", "python3", IMAGES[1],
                "-c", TRAINER)  # fmt: skip
        _docker("run", *_run_args(prometheus, names["prometheus"]), "--network", network,
                *[f"--network-alias={a}" for a in prometheus["networks"][0]["aliases"]],
                IMAGES[0], *prometheus["command"])  # fmt: skip
        train_ip = _docker("inspect", "--format", f"{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}",
                           names["train"]).stdout.strip()  # fmt: skip
        assert train_ip
        deadline = time.monotonic() + 120
        last = None
        while time.monotonic() < deadline:
            state = _docker("inspect", "--format", "{{.State.Running}}", names["prometheus"]).stdout.strip()
            assert state == "true", _docker("logs", names["prometheus"], check=False).stderr[-3000:]
            result = _docker("exec", names["prometheus"], "python3", "-c", TARGETS, check=False)
            if result.returncode == 0:
                targets = json.loads(result.stdout)["data"]["activeTargets"]
                last = [t for t in targets if t["labels"]["job"] == "dinops-train"]
                if last and last[0]["health"] == "up":
                    break
            time.sleep(3)
        logs = _docker("logs", names["prometheus"], check=False).stderr[-3000:]
        assert last and last[0]["health"] == "up", (last, logs)
        assert last[0]["scrapeUrl"] == f"http://{train_ip}:9109/metrics"
    finally:
        for name in names.values():
            _docker("rm", "--force", name, check=False)
        _docker("network", "rm", network, check=False)
