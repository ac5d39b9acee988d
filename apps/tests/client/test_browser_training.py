"""The training panel in a real headless Chromium, following a real training run: the CPU demo's recipe
(k8s/components/demo/train.env) shrunk to seconds (the train tests' tiny model on 64-pixel synthetic shapes, frozen
backbone), the API serving from its output folder and the client in front of it, all real processes on 127.0.0.1.

Run with ``pytest -m browser``; needs ``/usr/bin/chromium`` (apt package ``chromium``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dinops.data.synth import SynthSpec, generate
from dinops.serve.testing import free_port, running

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = REPO / "artifacts"
DEMO = REPO / "k8s" / "components" / "demo"
EPOCHS, STEPS_PER_EPOCH = 4, 4  # 8 images in batches of 2
TINY = {
    "DINO_MODEL_OVERRIDES": "hidden_dim=32,nheads=2,num_queries=10,enc_layers=1,dec_layers=1,dim_feedforward=64,"
    "dn_number=4,num_select=10",
    "DINO_TRAIN_SCALES": "56,64",
    "DINO_CROP_SCALES": "64",
    "DINO_CROP_SIZE": "40,64",
    "DINO_MAX_SIZE": "64",
    "DINO_EVAL_SIZE": "64",
    "DINO_BATCH_SIZE": "2",
    "DINO_LR_BACKBONE": "0",
}


def _env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return dict(pairs)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The API waiting for the run's checkpoint and the client, both started before the run."""
    root = tmp_path_factory.mktemp("training_stack")
    out = root / "output"
    api, client = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    api_env = _env_file(DEMO / "serve.env") | {
        "DINO_CHECKPOINT": str(out / "checkpoint.pth"),
        "DINO_BIND": api,
        "DINO_WAIT_FOR_MODEL": "true",
        "DINO_MODEL_POLL_S": "0.5",
    }
    with (
        running("serve", api_env, f"http://{api}", root / "serve.log", ready="/healthz"),
        running("client", {"DINO_API_URL": f"http://{api}", "CLIENT_BIND": client}, f"http://{client}",
                root / "client.log"),
    ):  # fmt: skip
        yield {"client": f"http://{client}", "root": root, "output": out}


@pytest.fixture(scope="module")
def page(browser):
    page = browser.new_page(viewport={"width": 1100, "height": 1300})
    page.set_default_timeout(240_000)
    yield page
    page.close()


def _until(condition, what: str, timeout: float = 240) -> None:
    """Poll from here: the page's CSP (script-src 'self') refuses the string predicates of wait_for_function."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _start_training(root: Path, out: Path) -> subprocess.Popen:
    data = generate(SynthSpec(train_images=8, val_images=4, image_size=64, categories=3, seed=5), root / "data")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")}
    env |= (
        _env_file(DEMO / "train.env")
        | TINY
        | {
            "DINO_DATA_ROOT": str(data),
            "DINO_OUTPUT_DIR": str(out),
            "DINO_DEVICE": "cpu",
            "DINO_EPOCHS": str(EPOCHS),
            "DINO_EVAL_EVERY": "1",  # an AP per epoch for the panel's table
            "DINO_CHECKPOINT_STEPS": "2",
            "DINO_TRAIN_METRICS_PORT": "0",
        }
    )
    log = open(root / "train.log", "wb")  # noqa: SIM115 (closed with the process below)
    process = subprocess.Popen([sys.executable, "-m", "dinops.cli", "train"], env=env, stdout=log, stderr=log)
    process.log = log
    return process


def test_the_panel_follows_a_real_training_run(stack, page):
    page.goto(stack["client"] + "/")
    page.wait_for_selector('#training[data-state="not_started"]')
    assert page.text_content("#training-message").startswith("No training run has started yet.")
    assert page.is_hidden("#training-run")
    assert page.text_content("#training-served") == "The API has no model loaded yet."

    training = _start_training(stack["root"], stack["output"])
    try:
        _until(lambda: (stack["output"] / "progress.json").exists(), "the run's progress file")
        page.reload()  # polls at once (not after the idle interval): the run lasts seconds
        # while it runs: the state, epoch and step, the progress bar, the curve of the steps so far
        _until(
            lambda: (
                page.get_attribute("#training", "data-state") in ("training", "evaluating")
                and float(page.get_attribute("#training-progress", "value") or 0) > 0
            ),
            "the panel to show the run in progress",
        )
        step_text = page.text_content("#training-step")
        assert f" of {STEPS_PER_EPOCH} (" in step_text and f" of {EPOCHS * STEPS_PER_EPOCH} in all)" in step_text
        assert page.get_attribute("#training-progress", "max") == str(EPOCHS * STEPS_PER_EPOCH)
        assert int(page.get_attribute("#training-loss", "data-points")) >= 1
        assert page.text_content("#training-speed").endswith("s/step")

        assert training.wait(timeout=600) == 0, (stack["root"] / "train.log").read_text()[-3000:]
    finally:
        training.kill()
        training.wait()
        training.log.close()

    page.wait_for_selector('#training[data-state="done"]')
    progress = json.loads((stack["output"] / "progress.json").read_text())
    total = EPOCHS * STEPS_PER_EPOCH
    assert page.text_content("#training-message") == f"Training finished: {total} steps in {EPOCHS} epochs."
    assert page.get_attribute("#training-progress", "value") == str(total)
    assert page.text_content("#training-eta") == "none"
    assert page.get_attribute("#training-loss", "data-points") == str(len(progress["loss_curve"])) == str(total)
    coordinates = page.get_attribute("#training-loss polyline", "points").split()
    assert len(coordinates) == total
    axis = page.locator("#training-loss text").all_text_contents()
    losses = [y for _, y in progress["loss_curve"]]
    assert axis == [f"{max(losses):.2f}", f"{min(losses):.2f}", "step 1", f"step {total}"]
    rows = page.locator("#training-evaluations tr.evaluation")
    assert rows.count() == EPOCHS == len(progress["evaluations"])
    first = rows.first.locator("td").all_text_contents()
    assert first[:2] == ["1", str(STEPS_PER_EPOCH)] and first[2] == f"{progress['evaluations'][0]['ap']:.3f}"
    assert page.is_hidden("#training-gpu-row")  # a CPU run reports no GPU

    # the API loads the run's final checkpoint (it follows the file) and the panel says which and when
    checkpoint = str(stack["output"] / "checkpoint.pth")
    _until(
        lambda: f"The API serves {checkpoint} (step {total}), loaded at " in page.text_content("#training-served"),
        "the panel to show the final checkpoint served",
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "client-training.png"), full_page=True)

    # a progress file that cannot be read: said in plain words, the page keeps working
    (stack["output"] / "progress.json").write_text('{"state": "training", "epo')
    page.wait_for_selector('#training[data-state="unreadable"]')
    text = page.text_content("#training-message")
    assert text.startswith("The training progress cannot be read: ") and "is not JSON" in text
    assert page.is_hidden("#training-run")
