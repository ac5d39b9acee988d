"""`dinops train --output-s3` when S3 misbehaves: an outage waited out while training goes on, an outage longer than
the retry window, and the catch-up of a resumed run. The store is s3_stand_in.py in front of moto's server: strict
(it refuses boto3's newer checksum headers, as older S3-compatible stores do) and switched to 503 for an outage.

Issue 27 asks for a 90 s outage with the default 30 min window; here it is 6 s with a 2 min window
(``--s3-retry-minutes 2``), the same ratio, and the backoff scales with the window (s3_output.Backoff: 1/1800 to 1/30
of it, 0.07 s to 4 s here instead of 1 s to 60 s), so the test takes seconds, not minutes."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from dinops import s3
from dinops.train import checkpoints
from dinops.train.engine import StepState
from dinops.train.main import main as train_main
from dinops.train.s3_output import EXIT_S3_UNREACHABLE, STAGING, S3Output

from ..conftest import AWS_TEST_ENV
from .conftest import tiny_train_args

pytestmark = pytest.mark.usefixtures("no_dino_env", "aws_env")
OUTAGE_S = 6.0
WINDOW = ("--s3-retry-minutes", "2")


@pytest.fixture(scope="module")
def store(moto_endpoint):
    from ..s3_stand_in import start

    stand_in = start(moto_endpoint, strict=True)
    yield stand_in
    stand_in.stop()


@pytest.fixture(autouse=True)
def _one_thread_then_nondeterministic():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one torch thread beside moto, the stand-in and the uploader on 2 cores
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(False)


def _args(data, out, bucket, store, prefix, *extra):
    return tiny_train_args(
        data, out, "--epochs", "1", "--checkpoint-steps", "2", "--eval-every", "0",
        "--output-s3", bucket.url(prefix), "--s3-endpoint", store.endpoint, *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def calm(train_synth, moto_endpoint, store, tmp_path_factory):
    """An undisturbed run through the strict store: (bucket, its OUTPUT_DIR)."""
    import boto3

    with pytest.MonkeyPatch.context() as env:
        for name in [k for k in os.environ if k.startswith(("DINO_", "AWS_"))]:
            env.delenv(name)
        for name, value in AWS_TEST_ENV.items():
            env.setenv(name, value)
        client = boto3.client("s3", endpoint_url=moto_endpoint)
        name = "dinops-resilience"
        bucket = SimpleNamespace(name=name, client=client, url=lambda prefix="": f"s3://{name}/{prefix}")
        client.create_bucket(Bucket=name)
        out = tmp_path_factory.mktemp("calm")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert train_main(_args(train_synth, out, bucket, store, "calm", *WINDOW)) == 0
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(False)
        yield bucket, out


def _objects(bucket, prefix: str) -> dict[str, str]:
    """name under the prefix -> the object's dinops-sha256."""
    found = {}
    for entry in bucket.client.list_objects_v2(Bucket=bucket.name, Prefix=prefix + "/").get("Contents", []):
        head = bucket.client.head_object(Bucket=bucket.name, Key=entry["Key"])
        found[entry["Key"].removeprefix(prefix + "/")] = head["Metadata"].get(s3.SHA256_METADATA, "")
    return found


def _manifest(bucket, prefix: str) -> s3.Manifest | None:
    return s3.Manifest.read(bucket.client, s3.parse_url(bucket.url(prefix)))


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_outage_in_the_middle_of_training_is_waited_out(train_synth, calm, store, tmp_path, caplog):
    bucket, calm_out = calm
    caplog.set_level(logging.INFO)
    storm = tmp_path / "storm"
    window: dict[str, float] = {}
    staged_during_outage: list[str] = []

    def outage() -> None:
        while not (storm / checkpoints.LATEST).is_file():  # the first checkpoint: its upload starts now
            time.sleep(0.02)
        store.down()
        window["down"] = time.time()
        time.sleep(OUTAGE_S)
        staged_during_outage.extend(p.name for p in (storm / STAGING).iterdir())
        window["up"] = time.time()
        store.up()

    switch = threading.Thread(target=outage, daemon=True)
    switch.start()
    assert train_main(_args(train_synth, storm, bucket, store, "storm", *WINDOW)) == 0
    switch.join(OUTAGE_S + 30)
    assert "up" in window, "the outage never started"

    during = [r for r in caplog.records if window["down"] < r.created < window["up"]]
    retries = [r.getMessage() for r in during if "S3 upload failed" in r.getMessage()]
    assert retries and all("ServiceUnavailable" in m and "training goes on" in m for m in retries), retries
    assert any(r.getMessage().startswith("checkpoint: epoch") for r in during), "training stopped during the outage"
    assert staged_during_outage, "no checkpoint was waiting for its upload at the end of the outage"
    assert not list((storm / STAGING).iterdir())  # then every one went up

    calm_objects, storm_objects = _objects(bucket, "calm"), _objects(bucket, "storm")
    # latest/ holds the newest checkpoint and the one the manifest named before it, which depends on timing (a latest
    # checkpoint still queued when a newer one comes is superseded); the manifests name the same step's
    latest = {n for n in calm_objects | storm_objects if n.startswith("latest/")}
    assert set(storm_objects) - latest == set(calm_objects) - latest == {
        "checkpoint0000.pth", "log.txt", "config.json", "console.log", s3.MANIFEST,
    }  # fmt: skip
    for name in ("checkpoint0000.pth", "log.txt", "config.json"):
        assert storm_objects[name] == _sha(storm / name), name
    console = bucket.client.get_object(Bucket=bucket.name, Key="storm/console.log")["Body"].read()
    assert (storm / "console.log").read_bytes().startswith(console)  # as it was at the end of training
    for prefix, out in (("calm", calm_out), ("storm", storm)):
        manifest = _manifest(bucket, prefix)
        assert (manifest.key, manifest.global_step) == (f"{prefix}/latest/checkpoint-g00000008.pth", 8)
        assert manifest.sha256 == _sha(out / checkpoints.LATEST)
        assert manifest.sha256 == _objects(bucket, prefix)["latest/checkpoint-g00000008.pth"]


def test_an_outage_longer_than_the_window_exits_75_with_everything_local(
    train_synth, s3_bucket, store, tmp_path, monkeypatch, caplog
):
    started = S3Output.start

    def start_then_outage(*args):
        mirror = started(*args)  # the start check needs the store; the outage begins right after it
        store.down()
        return mirror

    monkeypatch.setattr(S3Output, "start", staticmethod(start_then_outage))
    args = _args(train_synth, tmp_path, s3_bucket, store, "long", "--max-steps", "2")
    try:
        assert train_main([*args, "--s3-retry-minutes", "0.03"]) == EXIT_S3_UNREACHABLE
    finally:
        store.up()
    assert "dinops train: S3 unreachable for 0.03 min (--s3-retry-minutes, DINO_S3_RETRY_MINUTES)" in caplog.text
    assert "ServiceUnavailable" in caplog.text and "`--resume auto` continues" in caplog.text
    assert checkpoints.load(tmp_path / checkpoints.LATEST)["global_step"] == 2  # the local output is kept
    assert _manifest(s3_bucket, "long") is None


def test_a_resumed_run_catches_up_every_checkpoint_whose_content_the_bucket_lacks(calm, store, tmp_path):
    """Finding 20: a checkpoint whose upload was given up (a best or a numbered one) leaves an older one of the same
    size in S3, or none. The catch-up of a resume uploads every checkpoint*.pth (and log.txt, config.json) whose
    sha256 the bucket lacks: here a stale checkpoint0000.pth and a best checkpoint that is not there at all."""
    bucket, calm_out = calm
    out = shutil.copytree(calm_out, tmp_path / "out")
    checkpoints.keep_copy(out / checkpoints.LATEST, out / checkpoints.BEST)
    numbered = out / "checkpoint0000.pth"
    stale = os.urandom(numbered.stat().st_size)
    bucket.client.put_object(
        Bucket=bucket.name, Key="caught/checkpoint0000.pth", Body=stale,
        Metadata={s3.SHA256_METADATA: hashlib.sha256(stale).hexdigest()},
    )  # fmt: skip
    latest = _manifest(bucket, "calm")  # the latest checkpoint is in the bucket: only the others are caught up
    s3.Manifest(**{**vars(latest), "key": "caught/latest/checkpoint-g00000008.pth"}).write(
        bucket.client, s3.parse_url(bucket.url("caught"))
    )
    settings = argparse.Namespace(
        output_s3=bucket.url("caught"), s3_endpoint=store.endpoint, s3_retry_minutes=2.0, s3_checksums="auto"
    )
    mirror = S3Output.start(settings, out, rank=0)
    mirror.catch_up(StepState(epoch=1, step=0, global_step=8))
    mirror.finish()
    objects = _objects(bucket, "caught")
    for name in ("checkpoint0000.pth", checkpoints.BEST, "log.txt", "config.json"):
        assert objects.get(name) == _sha(out / name), name
    expected = {checkpoints.BEST, "checkpoint0000.pth", "log.txt", "config.json", "console.log", s3.MANIFEST}
    assert set(objects) == expected
