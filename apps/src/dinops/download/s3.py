"""S3-compatible storage (AWS, MinIO...) as a source of the archives or a place to stage them.

Credentials and region come from boto3's usual environment (``AWS_ACCESS_KEY_ID``...); the endpoint from
``--s3-endpoint``/``DOWNLOAD_S3_ENDPOINT``, else boto3's own ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from dinops.download.http import ChecksumError, Progress, verify


class S3Error(RuntimeError):
    pass


def parse_url(url: str) -> tuple[str, str]:
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise S3Error(f"{url!r} is not an s3://bucket/prefix URL")
    return parsed.netloc, parsed.path.strip("/")


def key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


class Store:
    def __init__(self, endpoint: str, connections: int) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.client = boto3.client("s3", endpoint_url=endpoint or None)
        self.transfer = TransferConfig(max_concurrency=connections, multipart_threshold=64 << 20)

    def _errors(self):
        import botocore.exceptions

        return (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)

    def download(self, url: str, name: str, target: Path, digests: dict[str, str], progress: Progress) -> None:
        bucket, prefix = parse_url(url)
        where = f"s3://{bucket}/{key(prefix, name)}"
        part = target.with_name(target.name + ".part")
        try:
            head = self.client.head_object(Bucket=bucket, Key=key(prefix, name))
            progress.start(head["ContentLength"])
            self.client.download_file(
                bucket, key(prefix, name), str(part), Callback=progress.update, Config=self.transfer
            )
        except self._errors() as exc:
            part.unlink(missing_ok=True)
            raise S3Error(f"{where}: {exc}") from exc
        try:
            verify(part, digests, where)
        except ChecksumError:
            part.unlink(missing_ok=True)
            raise
        os.replace(part, target)

    def upload(self, url: str, path: Path, digests: dict[str, str]) -> bool:
        """Upload unless an object of the same size and checksums is there; returns whether it uploaded."""
        bucket, prefix = parse_url(url)
        object_key = key(prefix, path.name)
        metadata = {f"dinops-{a}": v for a, v in sorted(digests.items())}
        try:
            head = self.client.head_object(Bucket=bucket, Key=object_key)
            if head["ContentLength"] == path.stat().st_size and head.get("Metadata", {}) == metadata:
                return False
        except self._errors() as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") not in {"404", "NoSuchKey", "NotFound"}:
                raise S3Error(f"s3://{bucket}/{object_key}: {exc}") from exc
        try:
            self.client.upload_file(
                str(path), bucket, object_key, ExtraArgs={"Metadata": metadata}, Config=self.transfer
            )
        except self._errors() as exc:
            raise S3Error(f"uploading to s3://{bucket}/{object_key} failed: {exc}") from exc
        return True
