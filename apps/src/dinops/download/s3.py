"""S3-compatible storage (AWS, MinIO...) as a source of the archives or a place to stage them.

The client, its credentials (boto3's standard chain only), retries and errors are those of every dinops app
(:mod:`dinops.s3`); the endpoint comes from ``--s3-endpoint``/``DOWNLOAD_S3_ENDPOINT``, else boto3's own
``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import os
from pathlib import Path

from dinops import s3
from dinops.download.http import ChecksumError, Progress, verify
from dinops.s3 import S3Error

__all__ = ["S3Error", "Store", "key", "parse_url"]


def parse_url(url: str) -> tuple[str, str]:
    location = s3.parse_url(url)
    return location.bucket, location.prefix


def key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


class Store:
    def __init__(self, endpoint: str, connections: int) -> None:
        from boto3.s3.transfer import TransferConfig

        self.client = s3.make_client(endpoint, connections=connections)
        self.transfer = TransferConfig(max_concurrency=connections, multipart_threshold=64 << 20)

    def download(self, url: str, name: str, target: Path, digests: dict[str, str], progress: Progress) -> None:
        bucket, prefix = parse_url(url)
        where = f"s3://{bucket}/{key(prefix, name)}"
        part = target.with_name(target.name + ".part")
        head = s3.head(self.client, bucket, key(prefix, name))
        if head is None:
            raise S3Error(f"{where} does not exist")
        progress.start(head["ContentLength"])
        try:
            self.client.download_file(
                bucket, key(prefix, name), str(part), Callback=progress.update, Config=self.transfer
            )
        except s3.client_errors() as exc:
            part.unlink(missing_ok=True)
            raise s3.failure(self.client, "downloading", bucket, key(prefix, name), exc) from exc
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
        head = s3.head(self.client, bucket, object_key)
        if head is not None and head["ContentLength"] == path.stat().st_size and head.get("Metadata", {}) == metadata:
            return False
        try:
            self.client.upload_file(
                str(path), bucket, object_key, ExtraArgs={"Metadata": metadata}, Config=self.transfer
            )
        except s3.client_errors() as exc:
            raise s3.failure(self.client, "uploading to", bucket, object_key, exc) from exc
        return True
