"""Downloads against a real local server that honours Range, cuts connections and corrupts bytes."""

from __future__ import annotations

import json
from pathlib import Path

from dinops.download.cli import Downloader
from dinops.download.http import Fetcher, Policy
from dinops.download.manifest import FILE as MANIFEST
from dinops.download.sources import Item
from dinops.download.testserver import Faults

PATH = "/zips/val2017.zip"


def _item(server, image_zip, sha256):
    server.files[PATH] = image_zip[1]
    return Item("val2017.zip", server.url + PATH, {"sha256": sha256(image_zip[1])})


def _spans(server):
    """(start, end) of every ranged GET of the archive, the size probe excepted."""
    spans = []
    for path, header in server.log:
        if path == PATH and header and header != "bytes=0-0":
            start, end = header.removeprefix("bytes=").split("-")
            spans.append((int(start), int(end)))
    return spans


def _assert_extracted(dest, members):
    for name, data in members.items():
        assert Path(dest, name).read_bytes() == data, name


def test_parallel_ranged_download_verifies_extracts_and_reruns_as_noop(server, image_zip, sha256, make_args):
    args = make_args(connections=3)
    item = _item(server, image_zip, sha256)
    assert Downloader(args).run([item], []) == 0
    _assert_extracted(args.dest, image_zip[0])
    assert list(Path(args.dest, ".downloads").iterdir()) == []  # the archive is removed after extraction
    entry = json.loads(Path(args.dest, MANIFEST).read_text())["files"]["val2017.zip"]
    assert (entry["state"], entry["extracted"], entry["url"]) == ("done", ["val2017"], item.url)
    spans = _spans(server)
    assert len(spans) == -(-len(image_zip[1]) // 2**20)  # one request per 1 MiB piece
    assert sum(end - start + 1 for start, end in spans) == len(image_zip[1])

    server.log.clear()
    assert Downloader(args).run([item], []) == 0
    assert server.log == []  # a re-run does no work, not even a request


def test_cut_connections_resume_mid_piece(server, image_zip, sha256, make_args):
    args = make_args(connections=2)
    item = _item(server, image_zip, sha256)
    server.faults[PATH] = Faults(cut_after=200_000, cuts=4)
    assert Downloader(args).run([item], []) == 0
    _assert_extracted(args.dest, image_zip[0])
    starts = {start for start, _ in _spans(server)}
    assert any(start % 2**20 for start in starts)  # retries continued inside a piece, not from its start


def test_interrupted_run_resumes_on_the_next_run(server, image_zip, sha256, make_args, tmp_path):
    item = _item(server, image_zip, sha256)
    server.faults[PATH] = Faults(cut_after=300_000, cuts=100)
    assert Downloader(make_args(retries=1, connections=1)).run([item], []) == 1
    part = Path(tmp_path, "data", ".downloads", "val2017.zip.part")
    state = json.loads(part.with_name(part.name + ".json").read_text())
    assert sum(state["done"]) >= 300_000
    assert not Path(tmp_path, "data", "val2017").exists()

    server.faults.clear()
    server.log.clear()
    assert Downloader(make_args()).run([item], []) == 0
    _assert_extracted(Path(tmp_path, "data"), image_zip[0])
    fetched = sum(end - start + 1 for start, end in _spans(server))
    assert fetched == len(image_zip[1]) - sum(state["done"])


def test_corrupt_bytes_are_detected_and_fetched_again(server, image_zip, sha256, make_args):
    args = make_args()
    item = _item(server, image_zip, sha256)
    server.faults[PATH] = Faults(corrupt=1)
    assert Downloader(args).run([item], []) == 0
    _assert_extracted(args.dest, image_zip[0])
    assert sum(end - start + 1 for start, end in _spans(server)) == 2 * len(image_zip[1])


def test_always_corrupt_fails_and_leaves_nothing_that_looks_complete(server, image_zip, sha256, make_args, caplog):
    args = make_args()
    item = _item(server, image_zip, sha256)
    server.faults[PATH] = Faults(corrupt=100)
    assert Downloader(args).run([item], []) == 1
    assert "checksum mismatch" in caplog.text
    assert not Path(args.dest, "val2017").exists()
    assert list(Path(args.dest, ".downloads").iterdir()) == []
    assert not Path(args.dest, MANIFEST).exists()  # nothing was recorded as done


def test_server_without_range_support(server, image_zip, sha256, make_args):
    args = make_args()
    item = _item(server, image_zip, sha256)
    server.faults[PATH] = Faults(ranges=False, cut_after=500_000, cuts=1)
    assert Downloader(args).run([item], []) == 0
    _assert_extracted(args.dest, image_zip[0])
    full_gets = [h for p, h in server.log if p == PATH and h != "bytes=0-0"]
    assert full_gets == ["", ""]  # cut once, started over once


def test_missing_file_is_a_clear_error(server, make_args, caplog):
    item = Item("nope.zip", server.url + "/zips/nope.zip")
    assert Downloader(make_args()).run([item], []) == 1
    assert "HTTP 404" in caplog.text and "nope.zip" in caplog.text


def test_files_download_in_parallel_with_progress(server, image_zip, sha256, make_args, tmp_path):
    names = [f"part{i}.bin" for i in range(3)]
    items = []
    for name in names:
        server.files[f"/f/{name}"] = image_zip[1]
        items.append(Item(name, f"{server.url}/f/{name}", {"sha256": sha256(image_zip[1])}))
    args = make_args(parallel_files=3, progress="on")
    assert Downloader(args).run(items, []) == 0
    for name in names:  # not zips: kept as they are
        assert Path(args.dest, ".downloads", name).read_bytes() == image_zip[1]


def test_fetch_small_is_atomic(server, tmp_path):
    server.files["/one.jpg"] = b"x" * 5000
    server.faults["/one.jpg"] = Faults(cut_after=1000, cuts=5)
    fetcher = Fetcher(Policy(retries=2, backoff_s=0.0, timeout_s=5))
    target = tmp_path / "one.jpg"
    try:
        fetcher.fetch_small(server.url + "/one.jpg", target)
    except Exception as exc:
        assert "gave up after 2 attempts" in str(exc)
    assert not target.exists()
    server.faults.clear()
    fetcher.fetch_small(server.url + "/one.jpg", target)
    assert target.read_bytes() == b"x" * 5000
