"""`dinops train --output-s3` at start: the check proves writing, not only listing (exit 2 naming the cause), and
multipart uploads left under the prefix by a killed run are aborted."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import re
from types import SimpleNamespace

import pytest

from dinops.train import checkpoints, s3_output
from dinops.train.main import main as train_main

from ..conftest import _moto_server
from .conftest import tiny_train_args

pytestmark = pytest.mark.usefixtures("no_dino_env")
BUCKET = "start-bucket"


def _policy(*actions: str) -> str:
    resources = [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"]
    return json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": list(actions), "Resource": resources}]}
    )


@pytest.fixture(scope="module")
def limited_users(tmp_path_factory):
    """moto's server checking signatures and IAM policies (https://docs.getmoto.org/en/latest/docs/iam.html): its first
    7 requests are not authenticated and create the bucket and two users whose policies allow listing but not
    uploading (``reader``), and uploading but not aborting a multipart upload (``no_abort``)."""
    import boto3

    server, endpoint = _moto_server(tmp_path_factory.mktemp("moto_start") / "moto.log", auth_free_requests=7)
    try:
        admin = {"aws_access_key_id": "admin", "aws_secret_access_key": "admin", "region_name": "us-east-1"}
        boto3.client("s3", endpoint_url=endpoint, **admin).create_bucket(Bucket=BUCKET)
        iam = boto3.client("iam", endpoint_url=endpoint, **admin)
        users = {}
        for user, actions in {
            "reader": ("s3:ListBucket", "s3:GetObject"),
            "no_abort": ("s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:DeleteObject"),
        }.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="dinops", PolicyDocument=_policy(*actions))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            users[user] = (key["AccessKeyId"], key["SecretAccessKey"])
        yield SimpleNamespace(endpoint=endpoint, users=users)
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.parametrize(
    "user,cause",
    [
        ("reader", r"uploading to s3://start-bucket/runs/r1/\.dinops-write-check failed: AccessDenied"),
        ("no_abort", r"aborting the multipart upload of s3://start-bucket/runs/r1/\.dinops-write-check failed: Access"),
    ],
)
def test_credentials_that_can_list_but_not_write_stop_before_training_with_exit_2(
    user, cause, limited_users, train_synth, aws_env, tmp_path, monkeypatch, caplog
):
    key_id, secret = limited_users.users[user]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    args = tiny_train_args(train_synth, tmp_path, "--epochs", "1", "--max-steps", "1", "--eval-every", "0")
    s3_settings = ["--output-s3", f"s3://{BUCKET}/runs/r1", "--s3-endpoint", limited_users.endpoint]
    assert train_main([*args, *s3_settings]) == 2
    assert re.search(rf"dinops train: --output-s3 \(DINO_OUTPUT_S3\) s3://{BUCKET}/runs/r1: {cause}", caplog.text)
    assert not (tmp_path / checkpoints.LATEST).exists() and "Epoch: [0]" not in caplog.text


def test_multipart_uploads_a_killed_run_left_under_the_prefix_are_aborted_at_start(s3_bucket, tmp_path, caplog):
    """Finding 21: parts of an upload nobody completes or aborts are billed for good. Only those under the run's
    prefix and older than the bound go (a younger one may be a live writer's). moto's server dates every multipart
    upload 2010-11-10T20:48:33Z (moto/s3/responses.py, list_multipart_uploads), so a bound reaching back beyond that
    date stands for "all of them are young"."""
    client = s3_bucket.client

    def uploads() -> set[str]:
        return {u["UploadId"] for u in client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", [])}

    def start() -> None:
        settings = argparse.Namespace(
            output_s3=s3_bucket.url("runs/r1"), s3_endpoint=s3_bucket.endpoint, s3_retry_minutes=1.0,
            s3_checksums="auto",
        )  # fmt: skip
        s3_output.S3Output.start(settings, tmp_path, rank=0).finish()

    killed = {"runs/r1/latest/checkpoint-g00000099.pth", "runs/r1/checkpoint0003.pth"}
    stale = {client.create_multipart_upload(Bucket=s3_bucket.name, Key=key)["UploadId"] for key in killed}
    other_key = "runs/r10/latest/checkpoint-g00000099.pth"  # another run whose prefix starts alike
    other = client.create_multipart_upload(Bucket=s3_bucket.name, Key=other_key)["UploadId"]
    since_moto_date = datetime.datetime.now(datetime.timezone.utc) - datetime.datetime(
        2010, 11, 10, tzinfo=datetime.timezone.utc
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(s3_output, "STALE_UPLOAD", since_moto_date + datetime.timedelta(days=1))
        start()
    assert uploads() == stale | {other}  # all "younger" than the bound: none aborted
    caplog.set_level(logging.INFO)
    start()  # the bound of every run: 6 hours
    assert uploads() == {other}
    assert caplog.text.count("aborted an incomplete multipart upload of s3://") == 2
    client.abort_multipart_upload(Bucket=s3_bucket.name, Key=other_key, UploadId=other)
