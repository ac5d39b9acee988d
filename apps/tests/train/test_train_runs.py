"""End-to-end training runs in subprocesses: resume after SIGKILL, SIGTERM, DDP, logs, eval, analyze."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dinops.train import checkpoints
from dinops.train.coco_eval import STAT_NAMES

from .conftest import TINY_MODEL, tiny_train_args

CHECKPOINT_KEYS = {
    "model",
    "optimizer",
    "lr_scheduler",
    "scaler",
    "epoch",
    "next",
    "images_seen",
    "global_step",
    "rng",
    "args",
    "model_config",
    "categories",
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")}
    env["OMP_NUM_THREADS"] = "1"  # the same thread count in every run keeps CPU results bitwise comparable
    return env


def _train_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "dinops.cli", "train", *args]


def _run(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _wait_for(proc: subprocess.Popen, path: Path, pattern: str, timeout: float = 180) -> None:
    regex = re.compile(pattern)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and regex.search(path.read_text()):
            return
        if proc.poll() is not None:
            raise AssertionError(f"training ended (rc {proc.returncode}) before {pattern!r} appeared")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"{pattern!r} did not appear in {path} within {timeout} s")


def _assert_same_weights(a: Path, b: Path, rtol: float = 0.0, atol: float = 0.0) -> None:
    wa, wb = checkpoints.load(a)["model"], checkpoints.load(b)["model"]
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=rtol, atol=atol, msg=lambda m, k=key: f"{k}: {m}")


@pytest.fixture(scope="module")
def reference_run(train_synth, tmp_path_factory):
    """Two uninterrupted epochs (16 steps) with a latest checkpoint every 3 steps."""
    out = tmp_path_factory.mktemp("reference")
    _run(_train_cmd(tiny_train_args(train_synth, out, "--epochs", "2", "--checkpoint-steps", "3", "--eval-every", "0")))
    return out


def test_sigkill_mid_epoch_then_resume_equals_uninterrupted(train_synth, reference_run, tmp_path):
    args = tiny_train_args(train_synth, tmp_path, "--epochs", "2", "--checkpoint-steps", "3", "--eval-every", "0")
    proc = subprocess.Popen(_train_cmd(args), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(proc, tmp_path / "console.log", r"checkpoint: epoch 1 step 4 ")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    killed_at = checkpoints.load(tmp_path / checkpoints.LATEST)
    assert killed_at["next"]["epoch"] == 1 and killed_at["next"]["step"] in (4, 7)  # mid-epoch
    _run(_train_cmd([*args, "--resume", "auto"]))
    assert re.search(r"resumed from .*checkpoint.pth at epoch 1 step [47]\n", (tmp_path / "console.log").read_text())
    final = checkpoints.load(tmp_path / checkpoints.LATEST)
    assert final["global_step"] == 16 and final["next"] == {"epoch": 2, "step": 0} and final["epoch"] == 1
    _assert_same_weights(reference_run / checkpoints.LATEST, tmp_path / checkpoints.LATEST, rtol=1e-5, atol=1e-6)
    for name in ("checkpoint0000.pth", "checkpoint0001.pth"):
        assert (tmp_path / name).is_file()


def test_sigterm_finishes_the_step_checkpoints_and_exits_143(train_synth, tmp_path, caplog, no_dino_env):
    args = tiny_train_args(train_synth, tmp_path, "--epochs", "50", "--checkpoint-steps", "0", "--eval-every", "0")
    proc = subprocess.Popen(_train_cmd(args), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for(proc, tmp_path / "console.log", r"Epoch: \[0\]\s+\[2/8\]")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    # Not 0: Kubernetes would count the evicted pod as a completed Job and never resume it.
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "received SIGTERM" in stderr and "stopped at epoch 0 step" in stderr
    ckpt = checkpoints.load(tmp_path / checkpoints.LATEST)
    assert ckpt.keys() >= CHECKPOINT_KEYS
    assert ckpt["next"]["epoch"] == 0 and 3 <= ckpt["next"]["step"] < 8 and ckpt["epoch"] == -1
    assert ckpt["global_step"] == ckpt["next"]["step"] and ckpt["images_seen"] == 2 * ckpt["next"]["step"]
    from dinops.model import DINOConfig, build_dino

    model = build_dino(DINOConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])  # strict: every key and shape
    # resuming mid-epoch with another global batch or other model settings is refused, and nothing is overwritten
    from dinops.train.main import main as train_main

    base = [*tiny_train_args(train_synth, tmp_path, "--resume", "auto"), "--deterministic", "false"]
    assert train_main([*base, "--batch-size", "1"]) == 2
    assert "stopped mid-epoch with a global batch of 2 images" in caplog.text
    assert train_main([*base, "--model-overrides", TINY_MODEL.replace("num_queries=10", "num_queries=12")]) == 2
    assert "was trained with other model settings (num_queries)" in caplog.text
    assert checkpoints.load(tmp_path / checkpoints.LATEST)["global_step"] == ckpt["global_step"]
    # a retried Job (here with a shorter schedule) continues and finishes the epoch
    _run(
        _train_cmd([*tiny_train_args(train_synth, tmp_path, "--epochs", "1", "--eval-every", "0"), "--resume", "auto"])
    )
    log_txt = [json.loads(line) for line in (tmp_path / "log.txt").read_text().splitlines()]
    assert [r["epoch"] for r in log_txt] == [0]


def test_ddp_two_gloo_processes_and_accumulation_equal_one_process(train_synth, tmp_path):
    # one input size (no padding differences; 96 px keeps GroupNorm of the 1x1 top level away at batch 1),
    # no denoising queries (their noise is drawn per process)
    size = ["--train-scales", "96", "--crop-scales", "96", "--crop-size", "96,96", "--max-size", "96"]
    same = [*size, "--model-overrides", TINY_MODEL + ",use_dn=false"]
    common = ["--epochs", "1", "--max-steps", "4", "--eval-every", "0", *same]
    _run(_train_cmd(tiny_train_args(train_synth, tmp_path / "one", *common)))
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "dinops.train.main",
    ]
    _run([*torchrun, *tiny_train_args(train_synth, tmp_path / "two", *common, "--batch-size", "1")])
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    assert config["world_size"] == 2 and config["global_batch"] == 2
    assert checkpoints.load(tmp_path / "two" / checkpoints.LATEST)["global_step"] == 4
    # Adam turns float-rounding differences of near-zero gradients into up to a fraction of a step (lr 2e-4)
    one, two = tmp_path / "one" / checkpoints.LATEST, tmp_path / "two" / checkpoints.LATEST
    _assert_same_weights(one, two, rtol=1e-3, atol=1e-4)
    # gradient accumulation: one process, batch 1, two micro-batches per step == batch 2
    _run(
        _train_cmd(tiny_train_args(train_synth, tmp_path / "accum", *common, "--batch-size", "1", "--accum-steps", "2"))
    )
    _assert_same_weights(one, tmp_path / "accum" / checkpoints.LATEST, rtol=1e-3, atol=1e-4)


@pytest.fixture(scope="module")
def evaluated_run(train_synth, tmp_path_factory):
    """Two epochs with evaluation, TensorBoard and a profiler trace; returns (output dir, stdout)."""
    out = tmp_path_factory.mktemp("evaluated")
    args = tiny_train_args(train_synth, out, "--epochs", "2", "--tensorboard", "true", "--profile-steps", "2")
    return out, _run(_train_cmd(args)).stdout


def test_logs_in_official_and_katib_formats(evaluated_run):
    out, stdout = evaluated_run
    records = [json.loads(line) for line in (out / "log.txt").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1]
    for r in records:
        assert {
            "train_loss",
            "train_class_error",
            "train_lr",
            "train_loss_ce",
            "train_loss_bbox",
            "train_loss_giou",
            "n_parameters",
        } <= r.keys()
        assert len(r["test_coco_eval_bbox"]) == 12 and all(-1 <= v <= 1 for v in r["test_coco_eval_bbox"])
    # one Katib metric line per epoch, its timestamp first (test_operator_launch.py reads them as Katib does)
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
    assert re.search(rf"^{stamp} epoch=1 loss=\S+ bbox_ap=\S+ bbox_ap50=\S+ bbox_ap75=\S+$", stdout, re.M)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert list((out / "profile").glob("*.json*")), "profiler trace"
    config = json.loads((out / "config.json").read_text())
    assert config["epochs"] == 2 and config["model_cfg"]["hidden_dim"] == 32 and config["num_classes"] == 0
    assert (out / checkpoints.BEST).is_file() and (out / "checkpoint0001.pth").is_file()


def test_eval_command_reproduces_the_logged_numbers(evaluated_run, train_synth, tmp_path, no_dino_env):
    from dinops.train.evaluate import main as eval_main

    out, _ = evaluated_run
    report_path = tmp_path / "eval.json"
    code = eval_main(
        [str(out / "checkpoint0001.pth"), "--data-root", str(train_synth), "--eval-size", "64", "--max-size", "64",
         "--num-workers", "0", "--device", "cpu", "--output", str(report_path)]
    )  # fmt: skip
    assert code == 0
    report = json.loads(report_path.read_text())
    logged = json.loads((out / "log.txt").read_text().splitlines()[-1])["test_coco_eval_bbox"]
    assert list(report["stats"]) == list(STAT_NAMES)
    assert list(report["stats"].values()) == pytest.approx(logged, abs=1e-9)
    assert report["detections"] and set(report["detections"][0]) == {"image_id", "category_id", "bbox", "score"}


def test_analyze_a_real_run(evaluated_run):
    from dinops.train.analyze import main as analyze_main

    out, _ = evaluated_run
    assert analyze_main([str(out)]) == 0
    summary = (out / "analysis" / "summary.md").read_text()
    assert "# Training summary (2 epoch(s))" in summary and "| 1 |" in summary
    assert all(
        (out / "analysis" / name).stat().st_size > 10_000
        for name in ("loss.png", "ap.png", "lr.png", "class_error.png")
    )


def test_eval_reads_an_official_format_checkpoint(evaluated_run, train_synth, tmp_path, no_dino_env):
    """Official DINO checkpoints are {'model': state_dict, 'args': argparse.Namespace, ...}: config from args."""
    import argparse

    from dinops.train.evaluate import main as eval_main

    out, _ = evaluated_run
    ours = checkpoints.load(out / "checkpoint0001.pth")
    official = tmp_path / "checkpoint0001_official.pth"
    torch.save(
        {"model": ours["model"], "args": argparse.Namespace(**ours["model_config"], lr=2e-4), "epoch": 1}, official
    )
    report_path = tmp_path / "eval.json"
    code = eval_main(
        [str(official), "--data-root", str(train_synth), "--eval-size", "64", "--max-size", "64",
         "--num-workers", "0", "--device", "cpu", "--output", str(report_path)]
    )  # fmt: skip
    assert code == 0
    logged = json.loads((out / "log.txt").read_text().splitlines()[-1])["test_coco_eval_bbox"]
    assert list(json.loads(report_path.read_text())["stats"].values()) == pytest.approx(logged, abs=1e-9)
