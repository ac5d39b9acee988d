"""dinops-prometheus for real: the deployments' configuration (k8s/components/monitoring/prometheus/) mounted
read-only at /etc/prometheus, a named volume at /prometheus, a read-only root filesystem, UID 10001. promtool in the
image accepts that configuration (and refuses a broken rule), the server becomes ready, loads the four alerts, serves
its classic web UI with every asset, passes its own health check, and the image adds to dinops-runtime only
Prometheus' binaries, web assets and directories (no package manager, nothing else)."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request

import pytest
import yaml
from images.imagetools import APP_UID, REPO, load_build, wait_http

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]

MONITORING = REPO / "k8s" / "components" / "monitoring" / "prometheus"
HARDENED = ("--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--user", f"{APP_UID}:{APP_UID}")
# The contract of the image (the deployments pass their own arguments).
DEFAULT_ARGS = ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
                "--web.listen-address=:9090"]  # fmt: skip
# What the image may add to dinops-runtime: exact paths, and trees below a prefix.
ADDED_EXACTLY = {
    "/usr/bin/prometheus",
    "/usr/bin/promtool",
    "/usr/share/dinops/debian-packages.txt",
    "/etc/prometheus",
    "/etc/prometheus/prometheus.yml",
    "/prometheus",
    "/usr/share/prometheus",
}
ADDED_BELOW = "/usr/share/prometheus/"
ADDED_BUDGET_BYTES = 120 * 10**6  # two Go binaries of ~48 MB and ~10 MB of web assets; the zone data alone is 200 MB
# Every path of the image (files, links, directories) and the executables on PATH, as JSON; run inside each image.
LISTING = r"""
import json, os
paths = []
for root, dirs, files in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    paths += [os.path.join(root, name) for name in dirs + files]
tools = sorted({n for d in os.environ["PATH"].split(":") if os.path.isdir(d) for n in os.listdir(d)})
print(json.dumps({"paths": paths, "tools": tools}))
"""


def _alerts() -> list[str]:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    return [rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def _config_dir(path, alerts_text: str | None = None):
    """prometheus.yml and alerts.yml (or a replacement for it) readable by the image's user, as a ConfigMap is."""
    path.mkdir()
    shutil.copy(MONITORING / "prometheus.yml", path / "prometheus.yml")
    if alerts_text is None:
        shutil.copy(MONITORING / "alerts.yml", path / "alerts.yml")
    else:
        (path / "alerts.yml").write_text(alerts_text)
    path.chmod(0o755)
    for file in path.iterdir():
        file.chmod(0o644)
    return path


def _self_scraped(base: str) -> bool:
    with urllib.request.urlopen(f"{base}/api/v1/targets", timeout=10) as response:
        return any(t["health"] == "up" for t in json.load(response)["data"]["activeTargets"])


def _health(docker, container: str) -> dict:
    return docker.inspect(container)["State"].get("Health") or {}


@pytest.fixture(scope="module")
def server(images, docker, tmp_path_factory):
    """The image as the deployments run it; yields (base URL, container, volume)."""
    config = _config_dir(tmp_path_factory.mktemp("prometheus") / "etc")
    volume = docker.name("volume", "prometheus-data")
    docker("volume", "create", volume)
    container = docker.name("container", "prometheus")
    # The image's own health check command, run every second instead of every 30 s so that the test does not wait.
    docker(
        "run", "-d", "--name", container, *HARDENED, "-p", "127.0.0.1::9090",
        "--health-interval", "1s", "--health-start-period", "60s",
        "-v", f"{config}:/etc/prometheus:ro", "-v", f"{volume}:/prometheus", images["prometheus"],
    )  # fmt: skip
    base = f"http://127.0.0.1:{docker.host_port(container, 9090)}"
    try:
        wait_http(f"{base}/-/ready", timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{docker.logs(container)[-3000:]}") from None
    yield base, container, volume


def test_plan_builds_it_by_default_with_both_parents(monkeypatch):
    """No Docker needed: the build stage gets the base, the final stage the runtime, and the tag follows the base."""
    build = load_build()
    monkeypatch.setattr(build, "image_id", lambda ref: "sha256:" + "a" * 64)
    steps = build.plan(build.AIRGAP_BASE)
    assert [s.name for s in steps][-1] == "prometheus" and "prometheus" in build.APPLICATIONS
    prometheus = {s.name: s for s in steps}["prometheus"]
    runtime = {s.name: s for s in steps}["runtime"]
    assert prometheus.build_args["BASE_IMAGE"] == build.AIRGAP_BASE
    assert prometheus.build_args["RUNTIME_IMAGE"] == runtime.image
    assert prometheus.image.startswith("dinops-prometheus:") and prometheus.dockerfile == "images/prometheus.Dockerfile"
    monkeypatch.setattr(build, "image_id", lambda ref: "sha256:" + "b" * 64)
    rebased = {s.name: s for s in build.plan(build.AIRGAP_BASE, ("prometheus",))}
    assert list(rebased) == ["runtime", "prometheus"]
    assert rebased["prometheus"].image != prometheus.image  # another base image: another tag


def test_metadata(images, docker):
    config = docker.inspect(images["prometheus"])["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["/usr/bin/tini", "--", "/usr/bin/prometheus"]
    assert config["Cmd"] == DEFAULT_ARGS
    assert list(config["ExposedPorts"]) == ["9090/tcp"]
    assert config["Healthcheck"]["Test"][:2] == ["CMD", "python3"]
    assert "http://127.0.0.1:9090/-/healthy" in config["Healthcheck"]["Test"][-1]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "dinops-prometheus"
    assert labels["org.opencontainers.image.version"] == images["prometheus"].split(":")[1].split("-")[0]
    assert labels["org.dinops.content-hash"] == images["prometheus"].rsplit("-", 1)[1]


def test_promtool_in_the_image_checks_the_deployment_config(images, docker, tmp_path):
    def check(config) -> tuple[int, str]:
        result = docker(
            "run", "--rm", *HARDENED, "-v", f"{config}:/etc/prometheus:ro", "--entrypoint", "/usr/bin/promtool",
            images["prometheus"], "check", "config", "/etc/prometheus/prometheus.yml", check=False,
        )  # fmt: skip
        return result.returncode, result.stdout + result.stderr

    status, output = check(_config_dir(tmp_path / "good"))
    assert status == 0, output
    assert f"SUCCESS: {len(_alerts())} rules found" in output

    broken = (MONITORING / "alerts.yml").read_text().replace("expr: |", "expr: rate(dinops_train_steps_total[", 1)
    status, output = check(_config_dir(tmp_path / "broken", broken))
    assert status == 1, output
    assert "FAILED" in output


def test_server_loads_the_alerts_and_writes_its_volume(server, images, docker):
    base, _, volume = server
    with urllib.request.urlopen(f"{base}/api/v1/rules?type=alert", timeout=10) as response:
        groups = json.load(response)["data"]["groups"]
    assert [rule["name"] for group in groups for rule in group["rules"]] == _alerts() != []
    assert all(rule["health"] != "err" for group in groups for rule in group["rules"])
    with urllib.request.urlopen(f"{base}/api/v1/status/flags", timeout=10) as response:
        flags = json.load(response)["data"]
    assert flags["storage.tsdb.path"] == "/prometheus" and flags["config.file"] == "/etc/prometheus/prometheus.yml"
    listing = docker(
        "run", "--rm", "-v", f"{volume}:/prometheus:ro", "--entrypoint", "python3", images["prometheus"], "-c",
        "import json, os; s = os.stat('/prometheus'); print(json.dumps([s.st_uid, sorted(os.listdir('/prometheus'))]))",
    ).stdout  # fmt: skip
    owner, entries = json.loads(listing)
    assert owner == APP_UID
    assert {"wal", "chunks_head", "queries.active"} <= set(entries)  # the TSDB on the volume, written by UID 10001


def test_web_ui_and_every_asset_it_loads(server):
    base, _, _ = server
    # Prometheus 2.42 without its React build redirects /graph to the classic UI that Debian ships.
    status, page = wait_http(f"{base}/graph", timeout=10)
    assert status == 200 and b"<title>" in page
    assets = set(re.findall(rb'(?:src|href)="(/classic/static/[^"]+)"', page))
    assert len(assets) > 10, assets  # jQuery, Bootstrap, moment-timezone, rickshaw, ...: the links Debian resolves
    missing = []
    for asset in sorted(assets):
        try:
            with urllib.request.urlopen(base + asset.decode(), timeout=10) as response:
                if response.status != 200 or not response.read():
                    missing.append(asset)
        except OSError:
            missing.append(asset)
    assert missing == []


def test_health_check_passes(server, docker):
    _, container, _ = server
    deadline = time.monotonic() + 60
    while _health(docker, container).get("Status") != "healthy" and time.monotonic() < deadline:
        time.sleep(1)
    health = _health(docker, container)
    assert health.get("Status") == "healthy", health
    assert health["Log"][-1]["ExitCode"] == 0


def test_the_image_alone_starts(images, docker):
    container = docker.name("container", "prometheus-alone")
    docker("run", "-d", "--name", container, "--user", f"{APP_UID}:{APP_UID}", "-p", "127.0.0.1::9090",
           images["prometheus"])  # fmt: skip
    base = f"http://127.0.0.1:{docker.host_port(container, 9090)}"
    try:
        wait_http(f"{base}/-/ready", timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{docker.logs(container)[-3000:]}") from None
    # The built-in configuration scrapes the server itself; discovery hands targets over every 5 s.
    status, body = wait_http(f"{base}/api/v1/targets", timeout=45, ok=lambda s: s == 200 and _self_scraped(base))
    targets = json.loads(body)["data"]["activeTargets"]
    assert [(t["labels"]["job"], t["scrapeUrl"]) for t in targets] == [("prometheus", "http://127.0.0.1:9090/metrics")]


def test_adds_only_prometheus_to_the_runtime(images, docker):
    def listing(image: str) -> dict:
        out = docker("run", "--rm", "--read-only", "--entrypoint", "python3", image, "-c", LISTING).stdout
        return json.loads(out)

    runtime, prometheus = listing(images["runtime"]), listing(images["prometheus"])
    added = set(prometheus["paths"]) - set(runtime["paths"])
    assert set(runtime["paths"]) <= set(prometheus["paths"])
    assert {p for p in added if not p.startswith(ADDED_BELOW)} == ADDED_EXACTLY
    assert "/usr/share/prometheus/web/templates/graph.html" in added
    assert set(prometheus["tools"]) - set(runtime["tools"]) == {"prometheus", "promtool"}
    assert not [t for t in prometheus["tools"] if t.startswith("apt")]  # dpkg's own tools are the runtime's
    size = docker.inspect(images["prometheus"])["Size"] - docker.inspect(images["runtime"])["Size"]
    assert size <= ADDED_BUDGET_BYTES, f"{size / 1e6:.0f} MB on top of dinops-runtime"

    version = docker("run", "--rm", "--read-only", images["prometheus"], "--version").stdout
    packages = docker("run", "--rm", "--read-only", "--entrypoint", "cat", images["prometheus"],
                      "/usr/share/dinops/debian-packages.txt").stdout  # fmt: skip
    debian = dict(line.split(" ", 1) for line in packages.splitlines())
    assert re.fullmatch(r"2\.42\.0\+ds-\d.*", debian["prometheus"]), debian  # bookworm's upstream release
    assert f"revision: {debian['prometheus']})" in version, version  # the recorded package is the binary's
