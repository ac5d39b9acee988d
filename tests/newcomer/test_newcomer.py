"""The CPU demo end to end, as a newcomer gets it: `ansible-playbook site.yml` on the default inventory of this
machine (no GPU: the Docker runtime with the demo), from an empty state, on this machine's Docker.

What is checked, in order, on one run of the whole stack:
1. site.yml ends green and prints the client's URL; the containers run the rendered layer (k8s/components/demo).
2. Training is killed mid-run (SIGKILL of its process, as the OOM killer would) after a checkpoint: Docker's
   on-failure policy restarts it and it resumes from that checkpoint instead of starting over.
3. Training finishes; inference picks up the final checkpoint by itself (it reloads a changed checkpoint).
4. A real Chromium uploads a validation image to the client on port 30000 and finds boxes drawn, labelled with the
   dataset's names (circle, square, triangle), never COCO's; the screenshot is the README's.
5. A second site.yml changes nothing (changed=0); a changed inference setting recreates dinops-serve alone.
6. A teardown removes the containers and keeps the data; the workloads stage brings them back on the same dataset
   and checkpoint (inference is ready at once, training has nothing left to do).

Marked ``demo``; `make test` runs it as its own stage (it takes over this machine's port 30000 and
/var/lib/dinops/volumes). Times are printed for the note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

# site.yml may rebuild the images (minutes) and training takes minutes on two cores.
pytestmark = [pytest.mark.demo, pytest.mark.timeout(3000)]

REPO = Path(__file__).resolve().parents[2]
DATA = Path("/var/lib/dinops/volumes")
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "artifacts"
DEMO_NAMES = {"circle", "square", "triangle"}
CONTAINERS = ("dinops-download", "dinops-train", "dinops-serve", "dinops-client")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env['PATH']}"
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    return env


def _playbook(*args: str, log: str) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    done = subprocess.run(
        ["ansible-playbook", "-i", "inventories/local", *args],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=3000, check=False,
    )  # fmt: skip
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / log).write_text(done.stdout + done.stderr)
    return done, time.monotonic() - began


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
    """No dinops container, network or data: the state of a machine that never ran the demo."""
    subprocess.run(["docker", "rm", "-f", *CONTAINERS, "dinops-checkpoint"], capture_output=True, check=False)
    subprocess.run(["docker", "network", "rm", "dinops"], capture_output=True, check=False)
    shutil.rmtree(DATA, ignore_errors=True)
    Path("/etc/ansible/facts.d/dinops_workloads.fact").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def demo():
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("the demo test needs this machine's Docker daemon: make docker")
    _clean_state()
    done, seconds = _playbook("site.yml", log="demo-site.log")
    print(f"\ndemo: site.yml from an empty state: {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert _recap(done.stdout)["failed"] == 0
    yield {"site_output": done.stdout, "times": {"first_site_s": seconds}}
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
    print(f"demo: training restarted and resumed {time.monotonic() - killed_at:.0f} s after the kill")
    assert "checkpoint.pth" in logs


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
    print(f"demo: training finished and inference reloaded {time.monotonic() - began:.0f} s later: {health}")


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


def test_a_second_run_changes_nothing(demo):
    done, seconds = _playbook("site.yml", log="demo-site-second.log")
    print(f"demo: second site.yml: {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    recap = _recap(done.stdout)
    changed = re.findall(r"changed: \[localhost\].*", done.stdout)
    assert recap["changed"] == 0, changed


def test_a_changed_setting_recreates_only_its_container(demo):
    before = {name: _inspect(name)["Id"] for name in CONTAINERS}
    extra = json.dumps({"workloads_config_extra": {"serve": {"DINO_THRESHOLD": "0.25"}}})
    done, seconds = _playbook("playbooks/workloads.yml", "-e", extra, log="demo-workloads-changed.log")
    print(f"demo: a changed inference setting rolled out in {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    after = {name: _inspect(name)["Id"] for name in CONTAINERS}
    assert [name for name in CONTAINERS if before[name] != after[name]] == ["dinops-serve"]
    assert "DINO_THRESHOLD=0.25" in _inspect("dinops-serve")["Config"]["Env"]
    assert _healthz().get("model") == "ready"


def test_teardown_keeps_the_data_and_the_workloads_come_back_on_it(demo):
    checkpoint = DATA / "dinops-output" / "checkpoint.pth"
    before = checkpoint.stat().st_mtime_ns
    done, _ = _playbook("playbooks/teardown.yml", log="demo-teardown.log")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert all(not _inspect(name) for name in CONTAINERS)
    assert checkpoint.stat().st_mtime_ns == before
    assert (DATA / "dinops-dataset" / "coco" / ".dinops-complete.json").is_file()
    done, seconds = _playbook("playbooks/workloads.yml", log="demo-workloads-again.log")
    print(f"demo: workloads back after a teardown: {seconds:.0f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    _wait("training to find nothing left to do", lambda: _inspect("dinops-train")["State"]["Status"] == "exited", 300)
    assert _inspect("dinops-train")["State"]["ExitCode"] == 0
    assert checkpoint.stat().st_mtime_ns == before
    assert _wait("inference ready on the kept checkpoint", lambda: _healthz().get("model") == "ready", 300)
