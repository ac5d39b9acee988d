"""`dinops train --output-s3`: uploads, the manifest, resume on a new VM, failures; moto's server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from dinops import s3
from dinops.train import checkpoints
from dinops.train.main import main as train_main
from dinops.train.s3_output import EXIT_S3_UNREACHABLE

from .conftest import tiny_train_args

pytestmark = pytest.mark.usefixtures("no_dino_env")


@pytest.fixture(autouse=True)
def _one_thread_then_nondeterministic():
    """One torch thread beside moto's server and the uploader (2 cores: 4x faster than torch's default of 2); in-process
    runs set deterministic algorithms, which later tests of this process must not inherit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(False)


def _args(data, out, bucket, prefix, *extra):
    return tiny_train_args(
        data, out, "--eval-every", "0", "--output-s3", bucket.url(prefix), "--s3-endpoint", bucket.endpoint, *extra
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _get(bucket, key: str) -> bytes:
    return bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read()


def _manifest(bucket, prefix: str) -> s3.Manifest | None:
    return s3.Manifest.read(bucket.client, s3.parse_url(bucket.url(prefix)))


def _keys(bucket, prefix: str) -> set[str]:
    return {e["Key"] for e in bucket.client.list_objects_v2(Bucket=bucket.name, Prefix=prefix).get("Contents", [])}


def _weights_equal(a, b) -> None:
    wa, wb = checkpoints.load(a)["model"], checkpoints.load(b)["model"]
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-5, atol=1e-6, msg=lambda m, k=key: f"{k}: {m}")


def test_uploads_then_resume_from_s3_after_the_local_output_is_gone(train_synth, s3_bucket, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    # an uninterrupted epoch of 8 steps, mirrored
    full = tmp_path / "full"
    assert train_main(_args(train_synth, full, s3_bucket, "full", "--epochs", "1", "--checkpoint-steps", "3")) == 0
    manifest = _manifest(s3_bucket, "full")
    local = (full / checkpoints.LATEST).read_bytes()
    assert manifest.key == "full/latest/checkpoint-g00000008.pth" and (manifest.epoch, manifest.step) == (1, 0)
    assert manifest.sha256 == _sha(local) and manifest.size == len(local) and manifest.global_step == 8
    assert _get(s3_bucket, manifest.key) == local
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key=manifest.key)
    assert head["Metadata"] == {"dinops-sha256": manifest.sha256}
    # The newest and the one the manifest named before stay; a latest checkpoint still queued when a newer one came is
    # superseded, never uploaded (s3_output.py), so on a slow machine that previous one may be g3 rather than g6.
    older = _keys(s3_bucket, "full/latest/") - {manifest.key}
    assert manifest.key in _keys(s3_bucket, "full/latest/") and len(older) <= 1, older
    assert older <= {"full/latest/checkpoint-g00000003.pth", "full/latest/checkpoint-g00000006.pth"}, older
    for name in ("checkpoint0000.pth", "log.txt", "config.json"):
        assert _get(s3_bucket, f"full/{name}") == (full / name).read_bytes(), name
    assert b"training time" in _get(s3_bucket, "full/console.log")
    assert "full/checkpoint_best_regular.pth" not in _keys(s3_bucket, "full/")  # no evaluation, no best

    # 5 steps, then the VM and its disk are gone; a new one resumes from the bucket
    part = tmp_path / "part"
    resumed = _args(train_synth, part, s3_bucket, "part", "--epochs", "1", "--checkpoint-steps", "3")
    assert train_main([*resumed, "--max-steps", "5"]) == 0
    assert _manifest(s3_bucket, "part").global_step == 5
    shutil.rmtree(part)
    caplog.clear()
    assert train_main([*resumed, "--resume", "auto"]) == 0
    assert re.search(r"restored .*checkpoint.pth \(epoch 0 step 5, sha256 \w+\) from s3://", caplog.text)
    assert re.search(r"resumed from .*checkpoint.pth at epoch 0 step 5\n", caplog.text)
    _weights_equal(full / checkpoints.LATEST, part / checkpoints.LATEST)  # the same as never interrupted
    assert _manifest(s3_bucket, "part").sha256 == _sha((part / checkpoints.LATEST).read_bytes())
    assert [json.loads(line)["epoch"] for line in _get(s3_bucket, "part/log.txt").decode().splitlines()] == [0]


def test_vm_destroyed_sigkill_then_a_fresh_output_dir_continues_from_s3(train_synth, s3_bucket, aws_env, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")} | aws_env | {"OMP_NUM_THREADS": "1"}
    args = _args(train_synth, tmp_path / "vm-a", s3_bucket, "vm", "--epochs", "2", "--checkpoint-steps", "4")
    command = [sys.executable, "-m", "dinops.cli", "train"]
    first = subprocess.Popen([*command, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _manifest(s3_bucket, "vm") is None:
        assert first.poll() is None, f"training ended (rc {first.returncode}) before a checkpoint reached S3"
        assert time.monotonic() < deadline, "no checkpoint reached S3 in 120 s"
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    published = _manifest(s3_bucket, "vm")  # an upload may have finished between the look and the kill
    assert published.global_step < 16, "the run finished before it was killed"

    fresh = tmp_path / "vm-b"
    args_b = _args(train_synth, fresh, s3_bucket, "vm", "--epochs", "2", "--checkpoint-steps", "4", "--resume", "auto")
    done = subprocess.run([*command, *args_b], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    epoch, step = published.epoch, published.step
    assert f"resumed from {fresh / checkpoints.LATEST} at epoch {epoch} step {step}\n" in done.stderr
    final = checkpoints.load(fresh / checkpoints.LATEST)
    assert final["global_step"] == 16 and final["next"] == {"epoch": 2, "step": 0}
    last = _manifest(s3_bucket, "vm")
    assert last.global_step == 16 and last.sha256 == _sha((fresh / checkpoints.LATEST).read_bytes())


def test_an_interrupted_upload_leaves_the_previous_checkpoint_published(
    train_synth, s3_bucket, tmp_path, monkeypatch, caplog
):
    """The network fails in the middle of the multipart upload of the second latest checkpoint (its third part) and
    stays down for latest checkpoints, longer than the retry window (here 1.8 s): the manifest keeps naming the first
    one, complete and sha-valid; training exits 75 (S3 unreachable) with the cause; a resume with the network back
    uploads what the bucket lacks."""
    from botocore.exceptions import ConnectionClosedError

    monkeypatch.setattr("dinops.train.s3_output.MULTIPART_BYTES", 8 << 20)  # the 47 MB checkpoints in 6 parts
    make_client = s3.make_client
    cut = {"on": True, "parts": 0}

    def cut_after_two_parts(request, **_):
        if cut["on"] and "/latest/checkpoint-g" in request.url and "checkpoint-g00000003" not in request.url:
            cut["parts"] += 1
            if cut["parts"] > 2:  # parts 1 and 2 of the first such upload reach the server
                raise ConnectionClosedError(endpoint_url=request.url)

    def faulty_client(*a, **kw):
        client = make_client(*a, **kw)
        client.meta.events.register("before-send.s3.UploadPart", cut_after_two_parts)
        client.meta.events.register("before-send.s3.PutObject", cut_after_two_parts)
        return client

    monkeypatch.setattr(s3, "make_client", faulty_client)
    caplog.set_level(logging.INFO)
    out = tmp_path / "out"
    args = _args(train_synth, out, s3_bucket, "cut", "--epochs", "1", "--checkpoint-steps", "3")
    assert train_main([*args, "--s3-retry-minutes", "0.03"]) == EXIT_S3_UNREACHABLE
    assert re.search(
        r"S3 upload failed: uploading to s3://\S+/cut/latest/checkpoint-g0000000[68].pth failed: ConnectionClosedError",
        caplog.text,
    )
    assert re.search(r"dinops train: .*OUTPUT_DIR .* holds everything: `--resume auto` continues", caplog.text)
    manifest = _manifest(s3_bucket, "cut")
    assert manifest.key == "cut/latest/checkpoint-g00000003.pth" and manifest.global_step == 3
    data = _get(s3_bucket, manifest.key)
    assert len(data) == manifest.size and _sha(data) == manifest.sha256
    assert _keys(s3_bucket, "cut/latest/") == {manifest.key}  # no half object under any key
    assert s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", []) == []  # aborted
    assert checkpoints.load(out / checkpoints.LATEST)["global_step"] == 8  # the local output is complete

    cut["on"] = False
    assert train_main([*args, "--resume", "auto"]) == 0  # nothing left to train; uploads what S3 lacks
    manifest = _manifest(s3_bucket, "cut")
    assert manifest.global_step == 8 and manifest.sha256 == _sha((out / checkpoints.LATEST).read_bytes())


def test_bad_s3_settings_stop_before_training_with_exit_2(train_synth, s3_bucket, tmp_path, caplog):
    base = tiny_train_args(train_synth, tmp_path, "--epochs", "1")
    cases = [
        (["--output-s3", "s3:/runs/x"], r"--output-s3 \(DINO_OUTPUT_S3\) 's3:/runs/x' is not an s3://bucket/prefix"),
        (["--output-s3", s3_bucket.url("x"), "--s3-endpoint", "127.0.0.1:9000"], r"--s3-endpoint \(DINO_S3_ENDPOINT"),
        (
            ["--output-s3", "s3://no-such-bucket/x", "--s3-endpoint", s3_bucket.endpoint],
            r"--output-s3 \(DINO_OUTPUT_S3\) s3://no-such-bucket/x: listing s3://no-such-bucket/x failed: NoSuchBucket",
        ),
        (
            ["--output-s3", s3_bucket.url("x"), "--s3-endpoint", "http://127.0.0.1:9"],
            r"--output-s3 \(DINO_OUTPUT_S3\) s3://\S+/x: listing .* failed: EndpointConnectionError",
        ),
    ]
    for extra, message in cases:
        caplog.clear()
        assert train_main([*base, *extra]) == 2, extra
        assert re.search(message, caplog.text), caplog.text
    assert not (tmp_path / checkpoints.LATEST).exists() and "Epoch: [0]" not in caplog.text


def test_wrong_credentials_exit_2_naming_the_setting_without_the_secret(
    train_synth, moto_auth, aws_env, tmp_path, monkeypatch, caplog, capfd
):
    wrong = "WRONG-" + "s" * 34
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_auth.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    monkeypatch.setenv("DINO_OUTPUT_S3", "s3://auth-bucket/runs/r50")
    monkeypatch.setenv("DINO_S3_ENDPOINT", moto_auth.endpoint)
    assert train_main(tiny_train_args(train_synth, tmp_path, "--epochs", "1")) == 2
    out, err = capfd.readouterr()
    assert re.search(
        r"dinops train: --output-s3 \(DINO_OUTPUT_S3\) s3://auth-bucket/runs/r50: listing s3://auth-bucket/runs/r50 "
        r"failed: SignatureDoesNotMatch: .* \(check AWS_SECRET_ACCESS_KEY\)",
        err,
    )
    for text in (out, err, caplog.text, (tmp_path / "console.log").read_text()):
        assert wrong not in text
    assert not (tmp_path / checkpoints.LATEST).exists()


def test_a_checkpoint_in_s3_that_does_not_match_its_manifest_is_not_resumed_from(
    train_synth, s3_bucket, tmp_path, caplog
):
    key = "bad/latest/checkpoint-g00000004.pth"
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=b"not this one")
    manifest = s3.Manifest(key, 12, _sha(b"the real one"), epoch=0, step=4, global_step=4)
    manifest.write(s3.make_client(s3_bucket.endpoint), s3.parse_url(s3_bucket.url("bad")))
    args = _args(train_synth, tmp_path, s3_bucket, "bad", "--epochs", "1", "--resume", "auto")
    assert train_main(args) == 1
    assert re.search(
        rf"dinops train: --resume auto from s3://{s3_bucket.name}/bad: s3://{s3_bucket.name}/{key}: sha256 \w+ does "
        rf"not match the expected {manifest.sha256}",
        caplog.text,
    )
    assert not list(tmp_path.glob("*.pth")) and not list(tmp_path.glob(".*.part"))
