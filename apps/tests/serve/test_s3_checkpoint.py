"""`dinops serve` with DINO_CHECKPOINT=s3://...: waiting, a verified download, reload on a new manifest or ETag;
moto's server on 127.0.0.1."""

from __future__ import annotations

import io
import logging
import time

import pytest
import requests
from PIL import Image

from dinops import s3
from dinops.serve.cli import main as serve_main
from dinops.serve.testing import free_port, running, write_small_checkpoint

SERVER_ENV = {"DINO_MIN_SIZE": "64", "DINO_MAX_SIZE": "96", "DINO_THREADS": "4", "DINO_MODEL_POLL_S": "0.2"}


def _until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _publish(bucket, prefix: str, path, seed: int, epoch: int, step: int, global_step: int) -> s3.Manifest:
    """What `dinops train --output-s3` does: the checkpoint under its own key, then the manifest."""
    write_small_checkpoint(path, seed=seed, next={"epoch": epoch, "step": step}, global_step=global_step)
    client = s3.make_client(bucket.endpoint)
    key = f"{prefix}/latest/checkpoint-g{global_step:08d}.pth"
    sha256 = s3.upload_file(client, path, bucket.name, key)
    manifest = s3.Manifest(key, path.stat().st_size, sha256, epoch, step, global_step)
    manifest.write(client, s3.parse_url(bucket.url(prefix)))
    return manifest


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((120, 90), 50).convert("RGB").save(buffer, "PNG")
    return buffer.getvalue()


def test_real_server_waits_for_the_manifest_loads_and_follows_it(s3_bucket, aws_env, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cache = tmp_path / "cache"
    env = SERVER_ENV | aws_env | {
        "DINO_CHECKPOINT": s3_bucket.url("run/"),
        "DINO_S3_ENDPOINT": s3_bucket.endpoint,
        "DINO_S3_CACHE_DIR": str(cache),
        "DINO_WAIT_FOR_MODEL": "true",
        "DINO_BIND": f"127.0.0.1:{port}",
    }  # fmt: skip

    def health() -> dict:
        return requests.get(url + "/healthz", timeout=10).json()

    def detect() -> requests.Response:
        return requests.post(url + "/v1/detect?threshold=0", data=_png(), headers={"Content-Type": "image/png"})

    with running("serve", env, url, tmp_path / "serve.log", ready="/healthz"):
        assert health()["model"] == "waiting" and health()["checkpoint"] == s3_bucket.url("run/")
        assert requests.get(url + "/readyz", timeout=10).status_code == 503
        first = _publish(s3_bucket, "run", tmp_path / "a.pth", seed=1, epoch=0, step=3, global_step=3)
        _until(lambda: health()["model"] == "ready", 120, "the first checkpoint to load")
        loaded = health()["loaded"]
        assert loaded["url"] == s3_bucket.url(first.key) and loaded["checkpoint"] == s3_bucket.url(first.key)
        assert (loaded["sha256"], loaded["size"], loaded["global_step"]) == (first.sha256, first.size, 3)
        answer = detect()
        assert answer.status_code == 200 and answer.json()["model"]["global_step"] == 3

        second = _publish(s3_bucket, "run", tmp_path / "b.pth", seed=2, epoch=2, step=0, global_step=16)
        _until(lambda: health()["loaded"]["global_step"] == 16, 120, "the second checkpoint")
        state = health()
        assert state["loaded"]["sha256"] == second.sha256 and state["reload"]["reloads"] == 1
        again = detect()
        assert again.status_code == 200 and again.json()["detections"] != answer.json()["detections"]
        cached = list((cache / "dinops-s3").glob("*.pth"))
        assert len(cached) == 1 and s3.file_sha256(cached[0]) == second.sha256  # the previous download is gone


def test_an_object_is_verified_and_followed_by_its_etag(s3_bucket, make_app, tmp_path):
    """In process, the real loader: an object whose sha256 metadata does not match its bytes is refused (nothing
    stays in the cache); the object replaced (a new ETag) is loaded."""
    key = "models/model.pth"
    path = write_small_checkpoint(tmp_path / "model.pth", seed=3)
    s3_bucket.client.put_object(
        Bucket=s3_bucket.name, Key=key, Body=path.read_bytes(), Metadata={"dinops-sha256": "0" * 64}
    )
    cache = tmp_path / "cache"
    app = make_app(
        DETECTOR=None,
        START=False,
        CHECKPOINT=s3_bucket.url(key),
        S3_ENDPOINT=s3_bucket.endpoint,
        S3_CACHE_DIR=str(cache),
        WAIT_FOR_MODEL=True,
        MODEL_POLL_S=0.1,
        MIN_SIZE=64,
        MAX_SIZE=96,
        WARMUP=False,
    )
    runtime = app.extensions["dino"]
    runtime.start()
    client = app.test_client()
    _until(lambda: runtime.model_state == "failed", 60, "the refused download")
    assert "sha256" in runtime.error and "does not match" in runtime.error and s3_bucket.url(key) in runtime.error
    assert list(cache.rglob("*.pth*")) == []
    s3.upload_file(s3.make_client(s3_bucket.endpoint), path, s3_bucket.name, key)
    _until(lambda: runtime.model_state == "ready", 60, "the replaced object to load")
    loaded = client.get("/healthz").get_json()["loaded"]
    etag = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key=key)["ETag"].strip('"')
    assert (loaded["url"], loaded["etag"], loaded["sha256"]) == (s3_bucket.url(key), etag, s3.file_sha256(path))
    assert client.get("/readyz").get_json()["model"]["checkpoint"] == s3_bucket.url(key)


@pytest.fixture
def restore_logging():
    """serve's CLI configures the root logger onto the captured stderr; moto's thread logs there after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(
    "checkpoint,message",
    [
        ("s3://{bucket}/models/missing.pth", "s3://{bucket}/models/missing.pth: no such object"),
        ("s3://no-such-bucket-x/m.pth", "NoSuchBucket"),
        ("s3://x/m.pth", "'x' is not a valid bucket name"),
    ],
)
def test_cli_checks_the_s3_checkpoint_before_serving(s3_bucket, capsys, monkeypatch, checkpoint, message):
    monkeypatch.delenv("DINO_CHECKPOINT", raising=False)
    argv = ["--checkpoint", checkpoint.format(bucket=s3_bucket.name), "--s3-endpoint", s3_bucket.endpoint]
    assert serve_main(argv) == 2
    err = capsys.readouterr().err
    assert "--checkpoint (DINO_CHECKPOINT)" in err and message.format(bucket=s3_bucket.name) in err


@pytest.mark.usefixtures("restore_logging")
def test_cli_wrong_credentials_exit_2_without_the_secret(moto_auth, aws_env, monkeypatch, capsys):
    wrong = "WRONG-" + "q" * 34
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_auth.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    monkeypatch.delenv("DINO_CHECKPOINT", raising=False)
    argv = ["--checkpoint", "s3://auth-bucket/run/", "--s3-endpoint", moto_auth.endpoint, "--wait-for-model", "true"]
    assert serve_main(argv) == 2
    out, err = capsys.readouterr()
    assert "SignatureDoesNotMatch" in err and "check AWS_SECRET_ACCESS_KEY" in err
    assert wrong not in out + err
