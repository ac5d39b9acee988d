"""The README's first command on a fresh machine, as a newcomer runs it: a fresh clone, no `.venv`, no Docker
daemon running, no systemd, then `make up` (the CPU demo: no GPU here, so the Docker runtime), timed from the clone
to the first correct detection.

What is checked, in order, on one run of the whole stack:
1. `make up` from the fresh clone (its own controller venv from the system's Python, the pinned collections, then
   site.yml, whose docker role starts the daemon without systemd) ends green and prints the client's URL; the
   containers run the rendered layer (k8s/components/demo).
2. The first correct detection through the web client's API: a validation image's shape found with its dataset
   name, IoU >= 0.5 with the annotation, above the client's threshold. The time from `git clone` is printed and
   written to artifacts/newcomer.json (`make bench` reports it).
3. Training is killed mid-run (SIGKILL, as the OOM killer would) after a checkpoint: Docker's on-failure policy
   restarts it and it resumes from that checkpoint instead of starting over.
4. While the resumed run trains (as a user would run it again), a second `make up` changes nothing (changed=0; the
   training container neither recreated nor restarted). The deployment's Prometheus, on the host's loopback only,
   scrapes the trainer and the API, sees the step counter advance and holds the alert rules, none firing.
5. Still during training, the client made public at this machine's own address (dinops_publish_address,
   docs/security.md): only the client is recreated, published there alone, over TLS only (the generated certificate
   verified for that address), behind a login with the generated root-only password that no output shows; the
   validator checks it over HTTPS; without the setting it is back on loopback.
6. Training finishes; inference picks up the final checkpoint by itself.
7. A real Chromium uploads a validation image to the client on port 30000 and finds boxes drawn, labelled with the
   dataset's names (circle, square, triangle), never COCO's; the screenshot is the README's. A changed inference
   setting recreates dinops-serve alone.
8. The README's teardown removes the containers and keeps the data; the workloads stage brings them back on the
   same dataset and checkpoint (and the client back on loopback).

The images are the ones the images stage built on this machine's Docker (the same content-hash tags, so `make up`
finds them): an inner daemon would fall back to the vfs driver, where the torch image costs minutes and gigabytes
per layer. The daemon's start without systemd is this test's own (the host's daemon is stopped first) and the
docker role's Molecule scenario `docker_nosystemd`.

Marked ``newcomer``; `make test` runs it as its own stage (it stops this machine's Docker daemon, takes over port
30000 and /var/lib/dinops/volumes). Times are printed for the note.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from newcomer.first_detection import first_correct_detection

from dinops_testing import working_tree_files

# make up may rebuild the images (minutes) and training takes minutes on two cores.
pytestmark = [pytest.mark.newcomer, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
CLONE = Path(os.environ.get("DINOPS_NEWCOMER_CLONE", "/root/dinops-newcomer"))
DATA = Path("/var/lib/dinops/volumes")
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "artifacts"
DEMO_NAMES = {"circle", "square", "triangle"}
CONTAINERS = ("dinops-download", "dinops-train", "dinops-serve", "dinops-client", "dinops-prometheus")
CLIENT = "http://127.0.0.1:30000"
# Prometheus (k8s/components/monitoring, on by default): published on the host's loopback only, in every mode.
PROMETHEUS = "http://127.0.0.1:9090"
# What a newcomer's shell has that this test process has on top: the project's dev venv, make's and pytest's state.
NOT_A_NEWCOMERS = ("VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "DINOPS_TIMINGS")


def _newcomer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in NOT_A_NEWCOMERS and not k.startswith(("ANSIBLE_", "PYTEST_", "MOLECULE_"))}  # fmt: skip
    dev_bins = {str(REPO / ".venv" / "bin")}
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if p not in dev_bins)
    return env


def _run(argv: list[str], log: str) -> tuple[subprocess.CompletedProcess, float]:
    """A command in the clone, as the README writes it, in a newcomer's environment; output kept in artifacts/."""
    began = time.monotonic()
    env = _newcomer_env()
    env["PATH"] = f"{CLONE / '.venv' / 'bin'}:{env['PATH']}" if argv[0] != "make" else env["PATH"]
    done = subprocess.run(argv, cwd=CLONE, env=env, capture_output=True, text=True, timeout=3000, check=False)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / log).write_text(done.stdout + done.stderr)
    return done, time.monotonic() - began


def _playbook(*args: str, log: str) -> tuple[subprocess.CompletedProcess, float]:
    return _run(["ansible-playbook", "-i", "inventories/local", *args], log=log)


def _recap(output: str) -> dict[str, int]:
    match = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output)
    assert match, output[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups()), strict=True))


def _inspect(name: str) -> dict:
    out = subprocess.run(["docker", "inspect", name], capture_output=True, text=True, check=False)
    return json.loads(out.stdout)[0] if out.returncode == 0 else {}


def _healthz() -> dict:
    code = (
        "import urllib.request; "
        "print(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=10).read().decode())"
    )
    out = subprocess.run(["docker", "exec", "dinops-serve", "python3", "-c", code], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def _wait(what: str, condition, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    logs = {
        n: subprocess.run(["docker", "logs", "--tail", "15", n], capture_output=True, text=True) for n in CONTAINERS
    }
    said = "\n".join(f"--- {n}\n{r.stdout[-1500:]}{r.stderr[-1500:]}" for n, r in logs.items())
    pytest.fail(f"{what}: not after {timeout:.0f} s\n{said}")


def _clean_state() -> None:
    """No dinops container, network, data or fact: the state of a machine that never ran `make up`."""
    subprocess.run(["docker", "rm", "-f", *CONTAINERS, "dinops-checkpoint"], capture_output=True, check=False)
    subprocess.run(["docker", "network", "rm", "dinops"], capture_output=True, check=False)
    shutil.rmtree(DATA, ignore_errors=True)
    for fact in Path("/etc/ansible/facts.d").glob("dinops*.fact"):
        fact.unlink()


def _fresh_clone() -> None:
    """`git clone` of this repository; a working tree with changes not yet committed is copied over it, so that the
    clone is exactly what is being tested (in CI, a clean clone of main, the copy changes nothing)."""
    shutil.rmtree(CLONE, ignore_errors=True)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(CLONE)], check=True)
    files = "\0".join(map(str, working_tree_files())).encode()
    subprocess.run(["rsync", "-a", "--from0", "--files-from=-", f"{REPO}/", f"{CLONE}/"], input=files, check=True)
    deleted = subprocess.run(["git", "ls-files", "-z", "--deleted"], cwd=REPO, capture_output=True, check=True)
    for name in filter(None, deleted.stdout.split(b"\0")):
        (CLONE / name.decode()).unlink(missing_ok=True)
    assert not (CLONE / ".venv").exists()


def _stop_docker() -> None:
    """This machine's Docker daemon stopped, as on a fresh machine (no systemd: dockerd was started by hand)."""
    if Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "stop", "docker.socket", "docker"], check=False)
    pids = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True).stdout.split()
    for pid in pids:
        os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + 120
    while subprocess.run(["pidof", "dockerd"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "dockerd did not stop within 120 s of SIGTERM"
        time.sleep(1)
    Path("/var/run/docker-ssd.pid").unlink(missing_ok=True)
    assert subprocess.run(["docker", "info"], capture_output=True).returncode != 0


@pytest.fixture(scope="module")
def demo():
    began = time.monotonic()
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        _clean_state()
    _stop_docker()
    _fresh_clone()
    cloned = time.monotonic()
    done, seconds = _run(["make", "up"], log="newcomer-make-up.log")
    print(f"\nnewcomer: git clone {cloned - began:.0f} s, then make up from nothing: {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert _recap(done.stdout)["failed"] == 0
    found = _wait("a correct detection through the web client", lambda: first_correct_detection(DATA, CLIENT),
                  timeout=1800, every=5)  # fmt: skip
    first = time.monotonic() - began
    print(f"newcomer: git clone to the first correct detection: {first:.0f} s ({found})")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "newcomer.json").write_text(
        json.dumps(
            {"clone_to_first_detection_s": round(first), "make_up_s": round(seconds), "detection": found}, indent=2
        )
    )
    yield {"site_output": done.stdout}
    _clean_state()


def test_site_yml_runs_the_demo_on_docker(demo):
    assert "Web client: http://" in demo["site_output"] and ":30000/" in demo["site_output"]
    for name in CONTAINERS:
        labels = _inspect(name)["Config"]["Labels"]
        assert labels["dinops.io/runtime"] == "docker" and labels["app.kubernetes.io/part-of"] == "dinops", name
    assert _inspect("dinops-download")["State"]["ExitCode"] == 0
    assert (DATA / "dinops-dataset" / "coco" / ".dinops-complete.json").is_file()
    fact = json.loads(Path("/etc/ansible/facts.d/dinops_workloads.fact").read_text())
    assert fact["runtime"] == "docker" and fact["workloads"] == list(CONTAINERS)
    assert _inspect("dinops-train")["HostConfig"]["ShmSize"] >= 512 * 2**20


def test_training_killed_mid_run_resumes_from_its_checkpoint(demo):
    checkpoint = DATA / "dinops-output" / "checkpoint.pth"
    _wait("training's first checkpoint", checkpoint.exists, timeout=600)
    state = _inspect("dinops-train")["State"]
    assert state["Running"], state
    # The trainer's process (under tini and the gate's shell), killed from the host as the OOM killer would.
    top = subprocess.run(
        ["docker", "top", "dinops-train", "-eo", "pid,args"], capture_output=True, text=True, check=True
    )
    pids = [
        int(line.split()[0]) for line in top.stdout.splitlines()[1:] if "dinops train" in line and "tini" not in line
    ]
    assert pids, top.stdout
    killed_at = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    inspect = _wait(
        "Docker restarting training", lambda: (i := _inspect("dinops-train"))["RestartCount"] >= 1 and i, 120
    )
    assert inspect["HostConfig"]["RestartPolicy"]["Name"] == "on-failure"

    def resumed() -> str:
        out = subprocess.run(["docker", "logs", "dinops-train"], capture_output=True, text=True)
        text = out.stdout + out.stderr
        return text if "resumed from" in text.lower() else ""

    logs = _wait("training resuming from its checkpoint", resumed, timeout=300)
    print(f"newcomer: training restarted and resumed {time.monotonic() - killed_at:.0f} s after the kill")
    assert "checkpoint.pth" in logs


def test_a_second_make_up_changes_nothing(demo):
    """Run again while the resumed training is still going, as a user would: nothing changes, the training
    container is neither recreated nor restarted (the stage also runs alongside training instead of after it)."""
    train = _inspect("dinops-train")
    done, seconds = _run(["make", "up"], log="newcomer-make-up-second.log")
    print(f"newcomer: second make up: {seconds:.0f} s (training {train['State']['Status']} when it started)")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    recap = _recap(done.stdout)
    changed = re.findall(r"changed: \[localhost\].*", done.stdout)
    assert recap["changed"] == 0, changed
    after = _inspect("dinops-train")
    assert after["Id"] == train["Id"] and after["RestartCount"] == train["RestartCount"], after["State"]


def _prometheus(path: str) -> dict:
    with urllib.request.urlopen(PROMETHEUS + path, timeout=10) as answer:
        return json.loads(answer.read())


def test_prometheus_scrapes_the_training_run(demo):
    """Still during training: the deployment's Prometheus (on 127.0.0.1:9090 only) scrapes the trainer and the API,
    sees the step counter advance and holds the alert rules, none of them firing."""
    assert _inspect("dinops-train")["State"]["Running"]
    bindings = _inspect("dinops-prometheus")["NetworkSettings"]["Ports"]["9090/tcp"]
    assert [(b["HostIp"], b["HostPort"]) for b in bindings] == [("127.0.0.1", "9090")], bindings

    def scraped() -> dict:
        try:
            targets = _prometheus("/api/v1/targets?state=active")["data"]["activeTargets"]
        except (OSError, ValueError, KeyError):
            return {}
        health = {t["labels"]["job"]: t["health"] for t in targets}
        return health if health.get("dinops-train") == "up" and health.get("dinops-serve") == "up" else {}

    health = _wait("Prometheus scraping the trainer and the API", scraped, timeout=120, every=3)
    print(f"newcomer: Prometheus targets {health}")

    def steps() -> list[float]:
        query = urllib.parse.quote("max(dinops_train_steps_total)")
        result = _prometheus(f"/api/v1/query?query={query}")["data"]["result"]
        return [float(r["value"][1]) for r in result]

    first = _wait("a scraped step counter", steps, timeout=60, every=3)[0]
    later = _wait("the step counter advancing in Prometheus", lambda: (v := steps()) and v[0] > first and v,
                  timeout=120, every=5)[0]  # fmt: skip
    print(f"newcomer: Prometheus saw dinops_train_steps_total go from {first:.0f} to {later:.0f}")
    rules = _prometheus("/api/v1/rules?type=alert")["data"]["groups"]
    alerts = {r["name"]: r["state"] for g in rules for r in g["rules"]}
    assert {"DinopsTrainingStalled", "DinopsDiskFilling"} <= set(alerts), alerts
    assert "firing" not in alerts.values(), alerts


def _host_address() -> str:
    """The address a user's browser would use for this VM: the source of its default route (Ansible's
    default_ipv4, which the workloads stage prints as the public address)."""
    route = subprocess.run(["ip", "-4", "-o", "route", "get", "8.8.8.8"], capture_output=True, text=True, check=True)
    match = re.search(r"\bsrc (\S+)", route.stdout)
    assert match, route.stdout
    return match.group(1)


def _https(context: ssl.SSLContext, url: str, data: bytes | None = None, headers: dict | None = None):
    """One request over TLS without following redirects: (status, headers, body)."""

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), Stay())
    request = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data else "GET")
    try:
        with opener.open(request, timeout=60) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def test_a_public_address_asks_for_a_login_over_tls(demo):
    """dinops_publish_address set to the VM's own address (the one setting docs/security.md names): the client is
    published there only, over TLS with the generated certificate, behind a login with the generated password; the
    stage prints where the password is, never the password; the validator checks the client over HTTPS."""
    address = _host_address()
    before = {name: _inspect(name)["Id"] for name in CONTAINERS}
    extra = json.dumps({"dinops_publish_address": address})
    done, seconds = _playbook("playbooks/workloads.yml", "-e", extra, log="newcomer-workloads-public.log")
    print(f"newcomer: the client made public at {address} in {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    password = Path("/etc/dinops/client-password").read_text().strip()
    assert len(password) >= 16
    assert Path("/etc/dinops/client-password").stat().st_mode & 0o077 == 0
    assert password not in done.stdout + done.stderr
    assert f"https://{address}:30000/" in done.stdout
    assert "sudo cat /etc/dinops/client-password" in done.stdout
    after = {name: _inspect(name)["Id"] for name in CONTAINERS}
    assert [name for name in CONTAINERS if before[name] != after[name]] == ["dinops-client"]
    bindings = _inspect("dinops-client")["NetworkSettings"]["Ports"]["8080/tcp"]
    assert {(b["HostIp"], b["HostPort"]) for b in bindings} == {(address, "30000")}
    _wait("the public client to answer over TLS", lambda: _probe_tls(address), timeout=120)
    # Plain HTTP carries no credential anywhere: the port speaks TLS only.
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://{address}:30000/login", timeout=10).read()
    # The certificate names this address: verified, not skipped.
    tls = ssl.create_default_context(cafile="/etc/dinops/tls/client.crt")
    base = f"https://{address}:30000"
    status, headers, _ = _https(tls, f"{base}/")
    assert status == 303 and headers["Location"].endswith("/login"), (status, dict(headers))
    image = sorted((DATA / "dinops-dataset" / "coco" / "val2017").glob("*.jpg"))[0]
    jpeg = {"Content-Type": "image/jpeg"}
    status, _, body = _https(tls, f"{base}/api/detect", image.read_bytes(), jpeg)
    assert status == 401 and json.loads(body)["login"] is True, (status, body[:300])
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    wrong = urllib.parse.urlencode({"user": "dinops", "password": "not-" + password}).encode()
    status, _, _ = _https(tls, f"{base}/login", wrong, form)
    assert status == 401
    login = urllib.parse.urlencode({"user": "dinops", "password": password}).encode()
    status, headers, _ = _https(tls, f"{base}/login", login, form)
    assert status == 303, status
    cookie = headers["Set-Cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie, cookie
    session = {**jpeg, "Cookie": cookie.split(";")[0]}
    status, _, body = _https(tls, f"{base}/api/detect", image.read_bytes(), session)
    assert status == 200, body[:300]
    assert {d["name"] for d in json.loads(body)["detections"]} <= DEMO_NAMES
    verify = ["scripts/verify.sh", "--json", "-i", "inventories/local", "-e", extra]
    verdict, _ = _run(verify, log="newcomer-verify-public.log")
    assert verdict.returncode == 0, verdict.stdout[-4000:] + verdict.stderr[-2000:]
    checks = [c for results in json.loads(verdict.stdout)["hosts"].values() for c in results]
    client = [c for c in checks if f"https://{address}:30000" in c.get("detail", "")]
    assert client and all(c["status"] == "pass" for c in client), checks
    # Without the setting the client is back on loopback, plain HTTP, no login: again the client alone is recreated.
    done, seconds = _playbook("playbooks/workloads.yml", log="newcomer-workloads-loopback.log")
    print(f"newcomer: the client back on loopback in {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    again = {name: _inspect(name)["Id"] for name in CONTAINERS}
    assert [name for name in CONTAINERS if after[name] != again[name]] == ["dinops-client"]
    bindings = _inspect("dinops-client")["NetworkSettings"]["Ports"]["8080/tcp"]
    assert {(b["HostIp"], b["HostPort"]) for b in bindings} == {("127.0.0.1", "30000")}


def _probe_tls(address: str) -> bool:
    context = ssl.create_default_context(cafile="/etc/dinops/tls/client.crt")
    try:
        status, _, _ = _https(context, f"https://{address}:30000/login")
    except (OSError, ssl.SSLError):
        return False
    return status == 200


def test_training_finishes_and_inference_serves_the_final_model(demo):
    began = time.monotonic()
    _wait("training to finish", lambda: _inspect("dinops-train")["State"]["Status"] == "exited", timeout=1500, every=5)
    state = _inspect("dinops-train")["State"]
    assert state["ExitCode"] == 0, subprocess.run(["docker", "logs", "--tail", "30", "dinops-train"],
                                                  capture_output=True, text=True).stderr  # fmt: skip
    final = (DATA / "dinops-output" / "checkpoint.pth").stat()

    def final_loaded() -> dict:
        health = _healthz()
        loaded = health.get("loaded") or {}
        return health if health.get("model") == "ready" and loaded.get("mtime_ns") == final.st_mtime_ns else {}

    health = _wait("inference to load the final checkpoint", final_loaded, timeout=300)
    print(f"newcomer: training finished and inference reloaded {time.monotonic() - began:.0f} s later: {health}")


def test_a_browser_uploads_an_image_and_sees_the_shapes_found(demo):
    if not CHROMIUM.exists():
        pytest.fail("the demo's browser check needs Debian's chromium: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    image = sorted((DATA / "dinops-dataset" / "coco" / "val2017").glob("*.jpg"))[0]
    args = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.set_default_timeout(120_000)
        page.goto("http://127.0.0.1:30000/")
        page.set_input_files("#file", str(image))
        page.wait_for_selector('#status[data-state="done"]')
        names = [r.locator("td").first.text_content() for r in page.locator("tr.detection").all()]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "demo-client.png"), full_page=True)
        box = page.evaluate("() => { const r = document.getElementById('canvas').getBoundingClientRect();"
                            " return [r.width, r.height]; }")  # fmt: skip
        browser.close()
    assert names, "no detection above the threshold on a validation image of the demo dataset"
    assert set(names) <= DEMO_NAMES, names
    assert max(box) >= 480, f"a {image.name} of the demo is shown at {box} CSS px: too small to read"


def test_a_changed_setting_recreates_only_its_container(demo):
    before = {name: _inspect(name)["Id"] for name in CONTAINERS}
    extra = json.dumps({"workloads_config_extra": {"serve": {"DINO_THRESHOLD": "0.25"}}})
    done, seconds = _playbook("playbooks/workloads.yml", "-e", extra, log="newcomer-workloads-changed.log")
    print(f"newcomer: a changed inference setting rolled out in {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    after = {name: _inspect(name)["Id"] for name in CONTAINERS}
    assert [name for name in CONTAINERS if before[name] != after[name]] == ["dinops-serve"]
    assert "DINO_THRESHOLD=0.25" in _inspect("dinops-serve")["Config"]["Env"]
    assert _healthz().get("model") == "ready"


def test_teardown_keeps_the_data_and_the_workloads_come_back_on_it(demo):
    checkpoint = DATA / "dinops-output" / "checkpoint.pth"
    before = checkpoint.stat().st_mtime_ns
    done, _ = _playbook("playbooks/teardown.yml", log="newcomer-teardown.log")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert all(not _inspect(name) for name in CONTAINERS)
    assert checkpoint.stat().st_mtime_ns == before
    assert (DATA / "dinops-dataset" / "coco" / ".dinops-complete.json").is_file()
    done, seconds = _playbook("playbooks/workloads.yml", log="newcomer-workloads-again.log")
    print(f"newcomer: workloads back after a teardown: {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    _wait("training to find nothing left to do", lambda: _inspect("dinops-train")["State"]["Status"] == "exited", 300)
    assert _inspect("dinops-train")["State"]["ExitCode"] == 0
    assert checkpoint.stat().st_mtime_ns == before
    assert _wait("inference ready on the kept checkpoint", lambda: _healthz().get("model") == "ready", 300)
