"""Checksums of files, read once in large blocks: one reader for the downloader's verification, the S3 objects'
SHA-256 metadata and the decoded-image cache's source identity."""

from __future__ import annotations

import hashlib
import os

BLOCK = 8 << 20


def file_digests(path: str | os.PathLike, algorithms: list[str]) -> dict[str, str]:
    """{algorithm: hex digest} of the file, every algorithm fed from one pass over it."""
    hashers = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as fh:
        while block := fh.read(BLOCK):
            for h in hashers.values():
                h.update(block)
    return {a: h.hexdigest() for a, h in hashers.items()}


def file_sha256(path: str | os.PathLike) -> str:
    return file_digests(path, ["sha256"])["sha256"]
