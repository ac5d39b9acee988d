"""S3 as destination and source, against moto's server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from dinops.download.cli import Downloader
from dinops.download.sources import Item


@pytest.fixture(scope="module")
def s3_endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="stage")
    yield client
    for entry in client.list_objects_v2(Bucket="stage").get("Contents", []):
        client.delete_object(Bucket="stage", Key=entry["Key"])
    client.delete_bucket(Bucket="stage")


def test_stage_to_s3_then_fetch_from_s3(server, s3, s3_endpoint, image_zip, sha256, make_args, tmp_path):
    server.files["/val2017.zip"] = image_zip[1]
    item = Item("val2017.zip", server.url + "/val2017.zip", {"sha256": sha256(image_zip[1])})
    staged = make_args(s3_dest="s3://stage/coco", s3_endpoint=s3_endpoint)
    assert Downloader(staged).run([item], []) == 0
    body = s3.get_object(Bucket="stage", Key="coco/val2017.zip")
    assert body["Body"].read() == image_zip[1]
    assert body["Metadata"] == {"dinops-sha256": sha256(image_zip[1])}

    server.log.clear()
    pulled = make_args(s3_source="s3://stage/coco", s3_endpoint=s3_endpoint, dest=str(tmp_path / "cluster"))
    assert Downloader(pulled).run([item], []) == 0
    assert server.log == []  # nothing came from HTTP
    for name, data in image_zip[0].items():
        assert Path(pulled.dest, name).read_bytes() == data


def test_s3_checksum_mismatch_and_missing_object(s3, s3_endpoint, make_args, caplog):
    s3.put_object(Bucket="stage", Key="coco/val2017.zip", Body=b"not the archive")
    item = Item("val2017.zip", "http://unused/val2017.zip", {"md5": "0" * 32})
    args = make_args(s3_source="s3://stage/coco", s3_endpoint=s3_endpoint)
    assert Downloader(args).run([item], []) == 1
    assert "checksum mismatch" in caplog.text
    assert list(Path(args.dest, ".downloads").iterdir()) == []
    missing = Item("train2017.zip", "http://unused/train2017.zip")
    assert Downloader(args).run([missing], []) == 1
    assert "s3://stage/coco/train2017.zip" in caplog.text


def test_upload_is_skipped_when_the_object_is_already_there(s3, s3_endpoint, tmp_path):
    from dinops.download.s3 import Store

    path = tmp_path / "a.zip"
    path.write_bytes(b"payload")
    store = Store(s3_endpoint, 2)
    assert store.upload("s3://stage/p", path, {"md5": "x"}) is True
    assert store.upload("s3://stage/p", path, {"md5": "x"}) is False
    assert store.upload("s3://stage/p", path, {"md5": "y"}) is True
