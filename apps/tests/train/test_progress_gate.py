"""The dataset gate tells the training panel why training has not started: `dinops data-ready` with
:func:`dinops.train.progress.data_ready`'s writer puts ``waiting_for_data`` and its reason into
OUTPUT_DIR/progress.json, which a real `dinops serve` answers on ``GET /v1/training`` and the web client passes to
its panel; an earlier run's file keeps its loss curve; once the marker appears the gate exits 0 and the trainer
takes the file over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dinops.client.app import clean_training
from dinops.data import ready
from dinops.download import marker
from dinops.train import progress
from dinops.train.settings import SETTINGS as TRAIN_SETTINGS

from ..training_api import training as _training
from ..training_api import waiting_server

GATE = "import sys; from dinops.train.progress import data_ready; sys.exit(data_ready(sys.argv[1:]))"


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("DINO_")}, **extra}


def _gate(*argv: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", GATE, *argv], env=_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _until(condition, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail("the condition never held")


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """A real `dinops serve` waiting for a checkpoint in ``out`` (the training output folder it reads progress from)."""
    out = tmp_path_factory.mktemp("output")
    with waiting_server(out) as url:
        yield url, out


def test_the_gate_and_the_trainer_read_the_same_variable():
    gate = next(s for s in ready.SETTINGS if s.dest == "output_dir")
    trainer = next(s for s in TRAIN_SETTINGS if s.dest == "output_dir")
    assert (gate.env, gate.flag_name) == (trainer.env, trainer.flag_name) == ("DINO_OUTPUT_DIR", "--output-dir")
    assert gate.default == "" and "output_dir" not in {s.dest for s in ready.EXTRA_SETTINGS}


def test_the_waiting_gate_is_what_the_api_and_the_panel_show_then_it_exits_0(tmp_path, serve):
    url, out = serve
    data = tmp_path / "coco"
    data.mkdir()
    (out / "progress.json").unlink(missing_ok=True)
    assert _training(url)["state"] == "not_started"
    with _gate("--data-root", str(data), "--poll", "0.1", DINO_OUTPUT_DIR=str(out)) as gate:
        try:
            document = _until(lambda: progress.read_document(out / "progress.json"))
            why = f"waiting for the dataset's download to complete: {data / '.dinops-complete.json'} is not there yet"
            assert document["state"] == "waiting_for_data" and document["reason"] == why
            assert document["loss_curve"] == [] and document["evaluations"] == [] and "epochs" not in document
            body = _training(url)
            assert body["state"] == "waiting_for_data" and body["reason"] == why
            assert body["progress_file"] == str(out / "progress.json") and body["served"] is None
            panel = clean_training(body)
            assert panel["state"] == "waiting_for_data" and panel["reason"] == why and "epochs" not in panel
            assert gate.poll() is None  # still waiting
            marker.write(data, {"sets": ["val2017"], "subset": 0, "files": 1})
            assert gate.wait(30) == 0
            assert gate.stdout.read().splitlines()[-1].startswith("the dataset is complete:")
        finally:
            if gate.poll() is None:
                gate.kill()
                gate.wait()
    # The trainer takes over: a new run replaces the gate's file (dinops.train.monitor: ProgressFile on start).
    trainer = progress.ProgressFile(out)
    trainer.set_state("training")
    assert _training(url)["state"] == "training" and "reason" not in _training(url)


EARLIER_RUN = {
    "state": "stopped",
    "reason": "SIGTERM",
    "started_at": "2026-11-27T01:00:00Z",
    "epoch": 1,
    "epochs": 12,
    "step": 40,
    "steps_per_epoch": 100,
    "global_step": 140,
    "total_steps": 1200,
    "loss_curve": [[1, 20.5], [100, 11.0], [140, 9.25]],
    "evaluations": [{"epoch": 0, "global_step": 100, "ap": 0.125, "ap50": 0.25, "ap75": 0.0625}],
    "checkpoint": {"path": "/output/checkpoint.pth", "epochs_done": 1, "global_step": 100, "saved_at": "x"},
    "updated_at": "2026-11-27T01:30:00Z",
}


def test_an_earlier_runs_file_keeps_its_curve_and_only_its_state_and_reason_change(tmp_path, capsys):
    out = tmp_path / "output"
    out.mkdir()
    progress.write_atomic(out / "progress.json", EARLIER_RUN)
    code = progress.data_ready(["--data-root", str(tmp_path / "coco"), "--output-dir", str(out), "--wait", "0.3",
                                "--poll", "0.1"])  # fmt: skip
    assert code == 1  # no marker within --wait
    document = progress.read_document(out / "progress.json")
    changed = {k for k in document.keys() | EARLIER_RUN.keys() if document.get(k) != EARLIER_RUN.get(k)}
    assert changed == {"state", "reason", "updated_at"}
    assert document["state"] == "waiting_for_data" and "is not there yet" in document["reason"]
    assert capsys.readouterr().err.count("training panel") == 0
    # The trainer resuming from the checkpoint's step carries the curve and the evaluations on.
    resumed = progress.ProgressFile(out)
    resumed.resume(100)
    kept = progress.read_document(out / "progress.json")
    assert kept["loss_curve"] == [[1, 20.5], [100, 11.0]] and kept["evaluations"] == EARLIER_RUN["evaluations"]


def test_a_missing_output_folder_is_an_error_and_is_not_created(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"output folder .* is not there \(is the output volume mounted here"):
        progress.waiting_for_data(tmp_path / "output", "why")
    assert not (tmp_path / "output").exists()


def test_a_broken_file_is_replaced(tmp_path):
    (tmp_path / "progress.json").write_text('{"state": "training", "epo')
    path = progress.waiting_for_data(tmp_path, "the reason", clock=lambda: 0.0)
    document = json.loads(path.read_text())
    assert document["state"] == "waiting_for_data" and document["reason"] == "the reason"
    assert document["started_at"] == document["updated_at"] == "1970-01-01T00:00:00Z"


def test_without_the_output_volume_the_gate_says_so_once_writes_nothing_and_still_passes(tmp_path):
    data = tmp_path / "coco"
    data.mkdir()
    marker.write(data, {"sets": ["val2017"], "subset": 0, "files": 1})
    missing = tmp_path / "output"
    with _gate("--data-root", str(tmp_path / "nothing"), "--wait", "0.5", "--poll", "0.1",
               DINO_OUTPUT_DIR=str(missing)) as waiting:  # fmt: skip
        assert waiting.wait(30) == 1
        err = waiting.stderr.read()
    assert err.count("the training panel is not told why training waits") == 1
    assert f"the output folder {missing} is not there (is the output volume mounted here?)" in err
    assert not missing.exists()
    with _gate("--data-root", str(data), DINO_OUTPUT_DIR=str(missing)) as done:
        assert done.wait(30) == 0 and not missing.exists()


def test_a_write_that_fails_never_stops_the_gate(tmp_path, capsys):
    (tmp_path / "progress.json").mkdir()  # the rename onto it fails: IsADirectoryError
    code = progress.data_ready(["--data-root", str(tmp_path / "coco"), "--output-dir", str(tmp_path), "--wait", "0.3",
                                "--poll", "0.1"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("the training panel is not told") == 1 and "gave up after" in err
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]  # no temporary file left behind


def test_no_output_folder_no_file(tmp_path):
    code = progress.data_ready(["--data-root", str(tmp_path / "coco"), "--wait", "0.2", "--poll", "0.1"])
    assert code == 1 and list(tmp_path.iterdir()) == []


def test_the_reason_names_an_empty_volume():
    target = Path("/data/coco/.dinops-complete.json")
    assert ready.reason(target, None) == (
        "waiting for the dataset's download to complete: /data/coco/.dinops-complete.json is not there yet"
    )
    assert ready.reason(target, "/data is an empty mount point").endswith("yet; /data is an empty mount point")
