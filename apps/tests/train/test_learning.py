"""The learning proof: a tiny DINO trained on CPU reaches bbox AP@[.5:.95] >= 0.5 on the synthetic val split.

Slow (minutes): marked ``slow``; CI runs it, `-m 'not slow'` leaves it out during development. The figures
measured are recorded in docs/training.md.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from dinops.data.synth import SynthSpec, generate

PROOF_DATA = SynthSpec(
    train_images=512,
    val_images=64,
    image_size=64,
    categories=3,
    min_objects=1,
    max_objects=3,
    min_object_size=0.25,
    max_object_size=0.5,
    max_occlusion=0.1,
    texture=0.3,
    seed=1,
)
PROOF_MODEL = (
    "hidden_dim=64,nheads=4,num_queries=20,enc_layers=1,dec_layers=2,dim_feedforward=256,dn_number=10,num_select=20"
)
PROOF_EPOCHS = 8
# The proof's budget is CPU time, not wall time: alone it takes 4.4 to 6.4 CPU-minutes on the build machines, and
# beside Molecule's scenarios in `make test` the same run took over 15 wall-minutes (CI, 2026-11-27: killed by the
# 900 s wall-clock timeout at 25% of a core). The kernel stops the training at this many CPU-seconds (RLIMIT_CPU,
# SIGXCPU); the wall-clock limits only catch a hang.
PROOF_CPU_S = 900
PROOF_WALL_S = 2400


def proof_args(data_root, output_dir) -> list[str]:
    return [
        "--data-root", str(data_root), "--output-dir", str(output_dir),
        "--model", "tiny", "--model-overrides", PROOF_MODEL,
        "--train-scales", "64", "--crop-scales", "64", "--crop-size", "48,64", "--max-size", "64", "--eval-size", "64",
        "--batch-size", "4", "--lr", "4e-4", "--lr-backbone", "1e-4", "--clip-max-norm", "1.0",
        "--epochs", str(PROOF_EPOCHS), "--lr-drop", str(PROOF_EPOCHS - 2), "--eval-every", str(PROOF_EPOCHS),
        "--num-workers", "0", "--device", "cpu", "--print-freq", "64", "--tensorboard", "false",
        "--checkpoint-steps", "0",
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(PROOF_WALL_S + 300)
def test_tiny_dino_learns_the_synthetic_shapes(tmp_path):
    data = generate(PROOF_DATA, tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")}
    env["OMP_NUM_THREADS"] = "1"  # steady on a shared machine: oversubscribed OpenMP threads spin and crawl
    began, cpu_before = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with subprocess.Popen(
        [sys.executable, "-m", "dinops.cli", "train", *proof_args(data, tmp_path / "out")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as training:
        # Set from here rather than in the child (preexec_fn is unsafe in a threaded process such as an xdist worker);
        # the interpreter's start-up before this line is a fraction of a second.
        resource.prlimit(training.pid, resource.RLIMIT_CPU, (PROOF_CPU_S, PROOF_CPU_S + 30))
        try:
            _, stderr = training.communicate(timeout=PROOF_WALL_S)
        except subprocess.TimeoutExpired:
            training.kill()
            raise
    minutes = (time.time() - began) / 60
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_minutes = (usage.ru_utime + usage.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime) / 60
    figures = f"{PROOF_EPOCHS} epochs in {minutes:.1f} min ({cpu_minutes:.1f} CPU min)"
    assert training.returncode != -signal.SIGXCPU, f"the training used more than {PROOF_CPU_S} CPU-seconds: {figures}"
    assert training.returncode == 0, stderr[-3000:]
    last = json.loads((tmp_path / "out" / "log.txt").read_text().splitlines()[-1])
    ap = last["test_coco_eval_bbox"][0]
    sys.stderr.write(f"learning proof: bbox AP {ap:.3f} after {figures}\n")
    assert last["epoch"] == PROOF_EPOCHS - 1
    assert ap >= 0.5, f"bbox AP@[.5:.95] {ap:.3f} < 0.5 after {figures}"
