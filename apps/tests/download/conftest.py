"""A local file server (session-wide, reset per test), zip builders and settings for the downloader."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import zipfile

import pytest

from dinops.download.cli import get_args_parser
from dinops.download.settings import SETTINGS
from dinops.download.testserver import FileServer
from dinops.settings import resolve


@pytest.fixture(scope="session")
def _server():
    server = FileServer()
    yield server
    server.close()


@pytest.fixture
def server(_server):
    _server.reset()
    return _server


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


@pytest.fixture(scope="session")
def make_zip():
    return _zip


@pytest.fixture(scope="session")
def image_zip():
    """``val2017.zip``-like: 3 MiB of incompressible 'images' under one top-level folder."""
    rng = random.Random(7)
    members = {f"val2017/{i:012d}.jpg": rng.randbytes(300_000 + i * 1000) for i in range(10)}
    return members, _zip(members)


@pytest.fixture(scope="session")
def sha256():
    return lambda data: hashlib.sha256(data).hexdigest()


@pytest.fixture
def coco_annotations(server):
    """An annotations zip whose instances_val2017.json lists 10 images served by ``server``."""
    rng = random.Random(3)
    images, annotations, files = [], [], {}
    for i in range(1, 11):
        name = f"{i:012d}.jpg"
        files[name] = rng.randbytes(2000 + i)
        images.append(
            {"id": i, "file_name": name, "width": 64, "height": 48, "coco_url": f"{server.url}/val2017/{name}"}
        )
        annotations += [
            {"id": 100 * i + k, "image_id": i, "category_id": 1 + k, "bbox": [1, 2, 3, 4], "area": 12, "iscrowd": 0}
            for k in range(2)
        ]
    document = {"info": {"description": "test"}, "images": images, "annotations": annotations,
                "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "bicycle"}]}  # fmt: skip
    archive = _zip({"annotations/instances_val2017.json": json.dumps(document).encode()})
    for name, data in files.items():
        server.files[f"/val2017/{name}"] = data
    server.files["/annotations/annotations_trainval2017.zip"] = archive
    return document, files, archive


@pytest.fixture
def make_args(tmp_path):
    """Settings as the CLI would resolve them, with fast retries and no progress bars."""

    def _make(*argv: str, **overrides) -> argparse.Namespace:
        args = get_args_parser().parse_args(["--dest", str(tmp_path / "data"), *argv])
        args = resolve(args, SETTINGS, environ={})
        defaults = {"backoff_s": 0.01, "progress": "off", "piece_mb": 1.0, "timeout_s": 10.0}
        for key, value in {**defaults, **overrides}.items():
            setattr(args, key, value)
        return args

    return _make
