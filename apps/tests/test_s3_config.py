"""The one S3 client configuration of the apps (dinops.s3), against moto's server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest

from dinops import s3


@pytest.mark.parametrize(
    "url,bucket,prefix",
    [
        ("s3://runs/dino/r50/", "runs", "dino/r50"),
        ("s3://runs", "runs", ""),
        ("s3://my.bucket-1/a", "my.bucket-1", "a"),
    ],
)
def test_parse_url(url, bucket, prefix):
    location = s3.parse_url(url)
    assert (location.bucket, location.prefix) == (bucket, prefix)
    assert location.key("latest.json") == (f"{prefix}/latest.json" if prefix else "latest.json")


@pytest.mark.parametrize(
    "url,why",
    [
        ("runs/dino", "is not an s3://bucket/prefix URL"),
        ("s3:/runs/dino", "is not an s3://bucket/prefix URL"),
        ("https://runs/dino", "is not an s3://bucket/prefix URL"),
        ("s3://", "is not an s3://bucket/prefix URL"),
        ("s3://a/x", "'a' is not a valid bucket name"),
        ("s3://bad_bucket!/x", "is not a valid bucket name"),
        ("s3://runs/x?versionId=3", "no query or fragment"),
    ],
)
def test_parse_url_names_the_setting_and_the_fault(url, why):
    with pytest.raises(s3.S3Error, match="--output-s3 \\(DINO_OUTPUT_S3\\)") as caught:
        s3.parse_url(url, "--output-s3 (DINO_OUTPUT_S3)")
    assert why in str(caught.value)


def test_client_retries_in_standard_mode_and_takes_the_endpoint_from_boto3s_variable(aws_env, monkeypatch):
    client = s3.make_client("http://127.0.0.1:9")
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 2}  # AWS_MAX_ATTEMPTS=2
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:10")  # boto3's own variable when the setting is empty
    assert s3.make_client("").meta.endpoint_url == "http://127.0.0.1:10"
    assert s3.make_client("", region="eu-west-3").meta.region_name == "eu-west-3"


def test_upload_download_and_manifest_round_trip(s3_bucket, tmp_path):
    client = s3.make_client(s3_bucket.endpoint)
    path = tmp_path / "model.pth"
    path.write_bytes(b"weights" * 1000)
    digest = s3.upload_file(client, path, s3_bucket.name, "run/model.pth")
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    head = s3.head(client, s3_bucket.name, "run/model.pth")
    assert head["Metadata"] == {"dinops-sha256": digest}
    assert s3.head(client, s3_bucket.name, "run/other.pth") is None
    target = s3.download_verified(client, s3_bucket.name, "run/model.pth", tmp_path / "got" / "model.pth")
    assert target.read_bytes() == path.read_bytes()
    location = s3.parse_url(s3_bucket.url("run"))
    assert s3.Manifest.read(client, location) is None
    manifest = s3.Manifest("run/model.pth", path.stat().st_size, digest, epoch=1, step=2, global_step=10)
    manifest.write(client, location)
    assert s3.Manifest.read(client, location) == manifest


def test_a_download_that_does_not_match_leaves_nothing(s3_bucket, tmp_path):
    client = s3.make_client(s3_bucket.endpoint)
    s3_bucket.client.put_object(
        Bucket=s3_bucket.name, Key="m.pth", Body=b"tampered", Metadata={"dinops-sha256": "0" * 64}
    )
    target = tmp_path / "m.pth"
    with pytest.raises(s3.S3Error, match=f"s3://{s3_bucket.name}/m.pth: sha256 .* does not match"):
        s3.download_verified(client, s3_bucket.name, "m.pth", target)
    with pytest.raises(s3.S3Error, match="8 bytes downloaded, 9 expected"):
        s3.download_verified(client, s3_bucket.name, "m.pth", target, size=9, sha256="")
    with pytest.raises(s3.S3Error, match=f"s3://{s3_bucket.name}/missing.pth does not exist"):
        s3.download_verified(client, s3_bucket.name, "missing.pth", target)
    assert list(tmp_path.iterdir()) == []


def test_missing_bucket_and_unreachable_endpoint(s3_bucket):
    client = s3.make_client(s3_bucket.endpoint)
    with pytest.raises(s3.S3Error, match="listing s3://no-such-bucket/p failed: NoSuchBucket: .*does not exist"):
        s3.check_access(client, s3.parse_url("s3://no-such-bucket/p"))
    with pytest.raises(s3.S3Error, match="s3://runs/p failed: EndpointConnectionError: Could not connect"):
        s3.check_access(s3.make_client("http://127.0.0.1:9"), s3.parse_url("s3://runs/p"))


def test_wrong_credentials_are_named_and_the_secret_never_appears(moto_auth, aws_env, monkeypatch, caplog):
    """A real signature check: the access key exists, the secret is wrong. Every log line of boto3 and botocore
    (DEBUG) and every message is searched for the secret."""
    wrong = "WRONG-secret-" + "x" * 27
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_auth.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    caplog.set_level(logging.DEBUG)
    client = s3.make_client(moto_auth.endpoint)
    location = s3.parse_url("s3://auth-bucket/runs")
    with pytest.raises(s3.S3Error) as caught:
        s3.check_access(client, location)
    message = str(caught.value)
    assert "s3://auth-bucket/runs" in message and "SignatureDoesNotMatch" in message
    assert "check AWS_SECRET_ACCESS_KEY" in message
    with pytest.raises(s3.S3Error, match="SignatureDoesNotMatch") as put:
        s3.put_bytes(client, b"{}", "auth-bucket", "runs/latest.json")
    for text in (message, str(put.value), caplog.text, repr(caught.value)):
        assert wrong not in text
    assert "botocore" in caplog.text  # the DEBUG lines were there to search
    # the right secret of a user without a policy: authenticated, not allowed
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_auth.secret)
    with pytest.raises(s3.S3Error, match="AccessDenied: .*lack the permission"):
        s3.check_access(s3.make_client(moto_auth.endpoint), location)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000")
    with pytest.raises(s3.S3Error, match="InvalidAccessKeyId: .*check AWS_ACCESS_KEY_ID"):
        s3.check_access(s3.make_client(moto_auth.endpoint), location)


def test_redact_removes_the_secret_of_the_credentials_in_use(aws_env):
    client = s3.make_client("http://127.0.0.1:9")
    text = f"proxy said: signature for {aws_env['AWS_SECRET_ACCESS_KEY']} rejected"
    assert s3.redact(text, client) == "proxy said: signature for *** rejected"


@pytest.fixture(scope="module")
def strict_store(moto_endpoint):
    """A store that refuses boto3's newer checksum headers and aws-chunked bodies (s3_stand_in.py)."""
    from .s3_stand_in import start

    stand_in = start(moto_endpoint, strict=True)
    yield stand_in
    stand_in.stop()


def test_a_custom_endpoint_gets_checksums_only_when_required_and_a_strict_store_takes_every_operation(
    s3_bucket, strict_store, tmp_path
):
    """Finding 17: with an endpoint (an S3-compatible store), botocore's request checksums and response validation
    default to "when_required"; our sha256 metadata stays the integrity check."""
    from boto3.s3.transfer import TransferConfig

    client = s3.make_client(strict_store.endpoint)
    path = tmp_path / "model.pth"
    path.write_bytes(os.urandom(6 << 20))
    multipart = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)  # 2 parts (S3's 5 MiB least)
    for key, transfer in (("run/single.pth", None), ("run/multi.pth", multipart)):
        digest = s3.upload_file(client, path, s3_bucket.name, key, transfer=transfer)
        got = s3.download_verified(client, s3_bucket.name, key, tmp_path / "got" / key, transfer=transfer)
        assert s3.file_sha256(got) == digest
    s3.put_bytes(client, b"{}", s3_bucket.name, "run/latest.json")
    assert s3.get_bytes(client, s3_bucket.name, "run/latest.json") == b"{}"
    s3.check_write(client, s3.parse_url(s3_bucket.url("run")))
    assert client.meta.config.request_checksum_calculation == "when_required"
    assert client.meta.config.response_checksum_validation == "when_required"

    # the stand-in does refuse boto3's defaults, as the store of the audit did
    default = s3.make_client(strict_store.endpoint, checksums="when_supported")
    with pytest.raises(s3.S3Error, match=r"InvalidArgument: Unsupported header\(s\): x-amz-checksum-crc32"):
        s3.put_bytes(default, b"{}", s3_bucket.name, "run/latest.json")


def test_aws_itself_keeps_botocores_checksums_and_the_environment_decides_when_set(aws_env, monkeypatch):
    assert s3.make_client("").meta.config.request_checksum_calculation == "when_supported"  # botocore's default
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:10")  # boto3's endpoint variable is an endpoint too
    assert s3.make_client("").meta.config.response_checksum_validation == "when_required"
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported")  # boto3's own variable wins over auto
    assert s3.make_client("http://127.0.0.1:9").meta.config.request_checksum_calculation == "when_supported"
    assert s3.make_client("http://127.0.0.1:9", checksums="when_required").meta.config.request_checksum_calculation == (
        "when_required"
    )
