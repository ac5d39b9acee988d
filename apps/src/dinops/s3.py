"""S3-compatible object storage (AWS S3, MinIO, Ceph...): the one client configuration of every dinops app.

Used by the downloader (archives), training (checkpoints and logs, ``--output-s3``) and the inference service
(``DINO_CHECKPOINT=s3://...``). What it holds, and nothing else:

- ``s3://bucket/prefix`` URLs (:func:`parse_url`);
- the client (:func:`make_client`): endpoint from the app's setting, else boto3's own ``AWS_ENDPOINT_URL``
  (https://docs.aws.amazon.com/sdkref/latest/guide/feature-ss-endpoints.html); credentials ONLY from boto3's
  standard chain: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, a profile, web identity,
  the instance or container role (https://boto3.amazonaws.com/v1/documentation/api/latest/guide/credentials.html);
  retries in botocore's ``standard`` mode (3 attempts unless ``AWS_MAX_ATTEMPTS`` says otherwise, exponential
  backoff on throttling, 5xx and connection errors:
  https://boto3.amazonaws.com/v1/documentation/api/latest/guide/retries.html); integrity checksums
  (:data:`CHECKSUMS`): with an endpoint of its own (an S3-compatible store) botocore adds them only where an operation
  requires them, since many stores refuse the CRC32 headers and ``aws-chunked`` bodies botocore sends by default;
  the ``dinops-sha256`` metadata below is the integrity check either way;
- :class:`S3Error`, the one error of every S3 operation: its message names ``s3://bucket/key``, the operation
  and the cause (the service's error code and message), and never a secret (:func:`redact`);
- object helpers: ``sha256`` metadata on upload, a verified atomic download, and the ``latest.json`` manifest that
  training writes last and the inference service follows (:class:`Manifest`).

Atomicity rests on S3's model: a PUT of one key is atomic, a reader gets the old or the new object and never part
of one, and reads after a successful PUT see it (strong read-after-write consistency); there is no atomic update
across keys (https://docs.aws.amazon.com/AmazonS3/latest/userguide/Welcome.html#ConsistencyModel). So a checkpoint
goes to its own key first and the manifest that points at it is written after, the last thing.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dinops.digests import file_sha256

MANIFEST = "latest.json"
SHA256_METADATA = "dinops-sha256"  # x-amz-meta-dinops-sha256 on every object dinops uploads
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html (dots and upper case of legacy
# buckets allowed: the service, not this check, has the last word)
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]$")
_MISSING = {"404", "NoSuchKey", "NotFound"}
# botocore's `request_checksum_calculation` / `response_checksum_validation` (botocore 1.44.5 config.py:253-282),
# both "when_supported" by default (configprovider.py:181-192, variables AWS_REQUEST_CHECKSUM_CALCULATION and
# AWS_RESPONSE_CHECKSUM_VALIDATION): a CRC32 header on every PutObject/UploadPart, an aws-chunked body with a trailing
# checksum over https (httpchecksum.py:384-393), checksum mode on every GetObject. Stores that predate them answer
# InvalidArgument, NotImplemented or MissingContentLength (https://github.com/boto/boto3/issues/4392, #4409).
# "auto": "when_required" with a custom endpoint (DINO_S3_ENDPOINT, DOWNLOAD_S3_ENDPOINT or boto3's AWS_ENDPOINT_URL),
# botocore's own choice for AWS itself or when one of the two variables says.
CHECKSUMS = ("auto", "when_supported", "when_required")
WRITE_CHECK = ".dinops-write-check"  # the probe object of check_write, under the prefix


class S3Error(RuntimeError):
    """An S3 operation failed; the message names the object and the cause, never a credential."""


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # no leading or trailing slash; may be empty

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, key: str | None = None) -> str:
        return f"s3://{self.bucket}/{self.prefix if key is None else key}"

    def __str__(self) -> str:
        return self.url()


def is_s3_url(text: str) -> bool:
    return text.startswith("s3://")


def parse_url(url: str, setting: str = "") -> S3Url:
    """``s3://bucket[/prefix]`` -> :class:`S3Url`; anything else is an :class:`S3Error` naming ``setting``."""
    where = f"{setting} " if setting else ""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise S3Error(f"{where}{url!r} is not an s3://bucket/prefix URL")
    if not _BUCKET.match(parsed.netloc):
        raise S3Error(f"{where}{url!r}: {parsed.netloc!r} is not a valid bucket name")
    if parsed.query or parsed.fragment or parsed.params:
        raise S3Error(f"{where}{url!r}: an S3 URL has no query or fragment")
    return S3Url(parsed.netloc, parsed.path.strip("/"))


def checksum_mode(endpoint: str, checksums: str = "auto") -> str | None:
    """The value of botocore's two checksum settings for ``endpoint`` (None: botocore decides, :data:`CHECKSUMS`)."""
    if checksums not in CHECKSUMS:
        raise S3Error(f"S3 checksums {checksums!r}: expected one of {', '.join(CHECKSUMS)}")
    if checksums != "auto":
        return checksums
    custom = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return "when_required" if custom else None


def make_client(endpoint: str = "", region: str = "", connections: int = 10, checksums: str = "auto"):
    """A boto3 S3 client. ``endpoint`` empty: boto3's ``AWS_ENDPOINT_URL`` or AWS itself; ``region`` empty:
    ``AWS_DEFAULT_REGION``/``AWS_REGION`` or the profile's; ``checksums``: :data:`CHECKSUMS`. Credentials are never
    passed in: boto3 finds them."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(region_name=region or None)
    mode = checksum_mode(endpoint, checksums)
    request_mode = None if checksums == "auto" and os.environ.get("AWS_REQUEST_CHECKSUM_CALCULATION") else mode
    response_mode = None if checksums == "auto" and os.environ.get("AWS_RESPONSE_CHECKSUM_VALIDATION") else mode
    config = Config(
        retries={"mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        max_pool_connections=max(10, connections),
        request_checksum_calculation=request_mode,
        response_checksum_validation=response_mode,
    )
    client = session.client("s3", endpoint_url=endpoint or None, config=config)
    client.dinops_session = session  # redact() reads the secret of the credentials actually in use
    return client


def redact(text: str, client=None) -> str:
    """``text`` without the secret access key or session token of ``client``'s credentials (or the
    environment's): botocore does not put them in messages, and this makes sure no service or proxy does."""
    secrets = {os.environ.get("AWS_SECRET_ACCESS_KEY", ""), os.environ.get("AWS_SESSION_TOKEN", "")}
    session = getattr(client, "dinops_session", None)
    credentials = session.get_credentials() if session is not None else None
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        secrets |= {frozen.secret_key or "", frozen.token or ""}
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def client_errors() -> tuple[type[BaseException], ...]:
    import botocore.exceptions
    from boto3.exceptions import S3TransferFailedError, S3UploadFailedError

    return (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, S3UploadFailedError,
            S3TransferFailedError)  # fmt: skip


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def describe(exc: BaseException, client=None) -> str:
    """The cause in one line: the service's code and message, or botocore's reason (no credentials)."""
    code = error_code(exc)
    if code:
        message = exc.response.get("Error", {}).get("Message", "") or str(exc)
        text = f"{code}: {message}"
        hint = {
            "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID",
            "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY",
            "AccessDenied": "the credentials lack the permission",
            "403": "access denied: check the credentials and their permissions",
            "NoSuchBucket": "the bucket does not exist",
        }.get(code)
        text = f"{text} ({hint})" if hint else text
    else:
        text = f"{type(exc).__name__}: {exc}"
    return redact(text, client)


def failure(client, action: str, bucket: str, key: str, exc: BaseException) -> S3Error:
    return S3Error(f"{action} s3://{bucket}/{key} failed: {describe(exc, client)}")


def head(client, bucket: str, key: str) -> dict[str, Any] | None:
    """The object's HEAD response, or None when there is no such object."""
    try:
        return client.head_object(Bucket=bucket, Key=key)
    except client_errors() as exc:
        if error_code(exc) in _MISSING:
            return None
        raise failure(client, "HEAD", bucket, key, exc) from exc


def check_access(client, location: S3Url) -> None:
    """One cheap call (a listing of at most one key under the prefix) that fails on a wrong endpoint, wrong
    credentials, a missing bucket or a missing permission."""
    try:
        client.list_objects_v2(Bucket=location.bucket, Prefix=location.prefix, MaxKeys=1)
    except client_errors() as exc:
        raise failure(client, "listing", location.bucket, location.prefix, exc) from exc


def check_write(client, location: S3Url) -> None:
    """Prove that uploads will work before anything depends on them: put and delete a small probe object
    (``s3:PutObject``, ``s3:DeleteObject``, a bucket policy demanding headers, a store refusing our requests), then
    create and abort one multipart upload, the way checkpoints go up (``s3:AbortMultipartUpload``; on a KMS-encrypted
    bucket ``kms:GenerateDataKey``, https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html)."""
    bucket, key = location.bucket, location.key(WRITE_CHECK)
    put_bytes(client, b"dinops write check\n", bucket, key, "text/plain")
    delete(client, bucket, key)
    try:
        upload = client.create_multipart_upload(Bucket=bucket, Key=key, Metadata={SHA256_METADATA: ""})
    except client_errors() as exc:
        raise failure(client, "starting a multipart upload to", bucket, key, exc) from exc
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
    except client_errors() as exc:
        raise failure(client, "aborting the multipart upload of", bucket, key, exc) from exc


def abort_stale_uploads(client, location: S3Url, older_than: datetime.timedelta) -> list[str]:
    """Abort the incomplete multipart uploads under ``location``'s prefix started more than ``older_than`` ago (a
    process killed in the middle of an upload cannot abort it; its parts are stored and billed until someone does:
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html). Younger ones may be a live writer's.
    Returns the keys aborted; needs ``s3:ListBucketMultipartUploads`` and ``s3:AbortMultipartUpload``."""
    prefix = location.key("")
    cutoff = datetime.datetime.now(datetime.timezone.utc) - older_than
    aborted = []
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=location.bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                # the prefix checked here too: not every store filters by it (moto 5.2.5 ignores it)
                if upload["Key"].startswith(prefix) and upload["Initiated"] <= cutoff:
                    key, upload_id = upload["Key"], upload["UploadId"]
                    client.abort_multipart_upload(Bucket=location.bucket, Key=key, UploadId=upload_id)
                    aborted.append(key)
    except client_errors() as exc:
        raise failure(client, "aborting stale multipart uploads under", location.bucket, prefix, exc) from exc
    return aborted


def upload_file(client, path: str | os.PathLike, bucket: str, key: str, sha256: str = "", transfer=None) -> str:
    """Upload ``path`` to ``key`` with its sha256 as metadata; returns the sha256. Multipart above the transfer's
    threshold: the object appears only when the last part is in, a failed upload leaves no object."""
    sha256 = sha256 or file_sha256(path)
    extra = {"Metadata": {SHA256_METADATA: sha256}}
    try:
        client.upload_file(str(path), bucket, key, ExtraArgs=extra, Config=transfer)
    except client_errors() as exc:
        raise failure(client, "uploading to", bucket, key, exc) from exc
    return sha256


def put_bytes(client, data: bytes, bucket: str, key: str, content_type: str = "application/octet-stream") -> None:
    sha256 = hashlib.sha256(data).hexdigest()
    try:
        client.put_object(
            Bucket=bucket, Key=key, Body=data, ContentType=content_type, Metadata={SHA256_METADATA: sha256}
        )
    except client_errors() as exc:
        raise failure(client, "uploading to", bucket, key, exc) from exc


def get_bytes(client, bucket: str, key: str) -> bytes | None:
    """The object's content, or None when there is no such object."""
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client_errors() as exc:
        if error_code(exc) in _MISSING:
            return None
        raise failure(client, "GET", bucket, key, exc) from exc


def delete(client, bucket: str, key: str) -> None:
    try:
        client.delete_object(Bucket=bucket, Key=key)
    except client_errors() as exc:
        raise failure(client, "DELETE", bucket, key, exc) from exc


def download_verified(
    client, bucket: str, key: str, target: Path, size: int | None = None, sha256: str = "", transfer=None
) -> Path:
    """Download to ``target`` atomically (a ``.part`` file renamed into place): the size and the sha256 are checked
    first (``sha256`` empty: the object's ``dinops-sha256`` metadata, if any); a mismatch leaves nothing behind."""
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    where = f"s3://{bucket}/{key}"
    try:
        if not sha256 or size is None:
            info = head(client, bucket, key)
            if info is None:
                raise S3Error(f"{where} does not exist")
            sha256 = sha256 or info.get("Metadata", {}).get(SHA256_METADATA, "")
            size = info["ContentLength"] if size is None else size
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            client.download_file(bucket, key, str(part), Config=transfer)
        except client_errors() as exc:
            raise failure(client, "downloading", bucket, key, exc) from exc
        got = part.stat().st_size
        if got != size:
            raise S3Error(f"{where}: {got} bytes downloaded, {size} expected")
        if sha256 and (actual := file_sha256(part)) != sha256:
            raise S3Error(f"{where}: sha256 {actual} does not match the expected {sha256}")
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return target


@dataclass(frozen=True)
class Manifest:
    """``latest.json``: which object is the latest checkpoint. Written only after that object is complete."""

    key: str  # the checkpoint's key in the same bucket
    size: int
    sha256: str
    epoch: int
    step: int
    global_step: int
    written_at: str = ""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def read(cls, client, location: S3Url) -> Manifest | None:
        """The manifest under ``location``'s prefix, or None when there is none yet."""
        key = location.key(MANIFEST)
        data = get_bytes(client, location.bucket, key)
        if data is None:
            return None
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError) as exc:
            raise S3Error(f"s3://{location.bucket}/{key} is not a dinops manifest: {exc}") from exc

    def write(self, client, location: S3Url) -> None:
        put_bytes(client, self.to_json(), location.bucket, location.key(MANIFEST), "application/json")
