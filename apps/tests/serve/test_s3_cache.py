"""The checkpoint downloads of `dinops serve` (DINO_S3_CACHE_DIR): a worker killed by the OOM killer or gunicorn's
timeout leaves its download behind; the next worker to start removes those of dead workers, never a live one's."""

from __future__ import annotations

import subprocess
import sys

from dinops.serve.s3_checkpoint import S3Checkpoint


def test_a_starting_worker_removes_the_downloads_of_dead_workers_only(aws_env, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # reaped: no process has this pid now (unless reused, then its file stays: safe)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cache = tmp_path / "dinops-s3"
        cache.mkdir()
        left = {
            f"checkpoint-{dead_pid}-0123456789abcdef.pth": False,  # a dead worker's model
            f".checkpoint-{dead_pid}-fedcba9876543210.pth.{dead_pid}.part": False,  # its download cut in the middle
            f"checkpoint-{live.pid}-0123456789abcdef.pth": True,  # another live worker's model in use
            f".checkpoint-{live.pid}-fedcba9876543210.pth.{live.pid}.part": True,  # its download under way
            "notes.txt": True,  # not ours
        }
        for name in left:
            (cache / name).write_bytes(b"x" * 10)
        S3Checkpoint("s3://runs/dino/r50/", "http://127.0.0.1:9", str(tmp_path))
        assert {p.name for p in cache.iterdir()} == {name for name, stays in left.items() if stays}
    finally:
        live.kill()
        live.wait()
