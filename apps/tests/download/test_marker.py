"""The completion marker <dest>/.dinops-complete.json: written only after success, never left by a failed or
changing run, rewritten by an idempotent re-run."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from dinops.download import marker
from dinops.download.cli import Downloader
from dinops.download.cli import main as download_main
from dinops.download.manifest import FILE as MANIFEST
from dinops.download.manifest import Manifest
from dinops.download.sources import Item
from dinops.download.testserver import Faults

PATH = "/zips/val2017.zip"


def _item(server, image_zip, sha256, digest=None):
    server.files[PATH] = image_zip[1]
    return Item("val2017.zip", server.url + PATH, {"sha256": digest or sha256(image_zip[1])})


def test_marker_is_written_after_every_file_is_verified_and_extracted(
    server, image_zip, sha256, make_args, monkeypatch
):
    args = make_args()
    item = _item(server, image_zip, sha256)
    seen = {}
    real_write = marker.write

    def checking_write(root, fields):
        # at the moment the marker is written, everything is in place and recorded as done
        seen["extracted"] = all(Path(root, name).is_file() for name in image_zip[0])
        seen["manifest"] = json.loads(Path(root, MANIFEST).read_text())["files"]["val2017.zip"]["state"]
        seen["no_part"] = not any(Path(root, ".downloads").glob("*.part"))
        return real_write(root, fields)

    monkeypatch.setattr(marker, "write", checking_write)
    assert Downloader(args).run([item], []) == 0
    assert seen == {"extracted": True, "manifest": "done", "no_part": True}
    body = json.loads(Path(args.dest, ".dinops-complete.json").read_text())
    assert body["complete"] is True and body["files"] == 1 and body["subset"] == 0
    assert body["sets"] == ["train2017", "val2017", "annotations"] and body["items"] == ["val2017.zip"]
    assert body["finished_at"].endswith("Z") and time.strptime(body["finished_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert marker.read(args.dest) == body
    assert not [p for p in Path(args.dest).iterdir() if p.name.endswith(".tmp")]


def test_marker_is_absent_while_the_download_runs(server, image_zip, sha256, make_args):
    args = make_args(connections=1)
    item = _item(server, image_zip, sha256)
    server.faults[PATH] = Faults(bytes_per_s=3_000_000)  # about a second for the 3 MiB archive
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("code", Downloader(args).run([item], [])))
    runner.start()
    target = Path(args.dest, marker.MARKER)
    extracted = [Path(args.dest, name) for name in image_zip[0]]
    absent = 0
    while runner.is_alive():
        # The marker may be there while the thread is still returning from run() (seen on a loaded machine), but
        # never before every file is in place.
        if target.exists():
            assert all(path.is_file() for path in extracted)
        else:
            absent += 1
        time.sleep(0.02)
    runner.join()
    assert absent > 0 and result["code"] == 0 and target.is_file()


def test_failed_run_leaves_no_marker(server, image_zip, sha256, make_args):
    args = make_args()
    good = _item(server, image_zip, sha256)
    assert Downloader(args).run([good], []) == 0
    assert Path(args.dest, marker.MARKER).is_file()
    # the same destination, a file that can never be verified (bad checksum): the stale marker goes first
    bad = Item("other.zip", server.url + PATH, {"sha256": "0" * 64})
    assert Downloader(make_args(retries=1)).run([good, bad], []) == 1
    assert not Path(args.dest, marker.MARKER).exists()
    assert marker.read(args.dest) is None


def test_bad_checksum_from_the_start_writes_no_marker(server, image_zip, sha256, make_args, caplog):
    args = make_args(retries=1)
    item = _item(server, image_zip, sha256, digest="f" * 64)
    assert Downloader(args).run([item], []) == 1
    assert "checksum mismatch" in caplog.text
    assert not Path(args.dest, marker.MARKER).exists()


def test_stale_marker_is_removed_when_a_run_starts_that_changes_the_dataset(
    server, image_zip, sha256, make_args, monkeypatch
):
    args = make_args()
    dest = Path(args.dest)
    dest.mkdir(parents=True)
    marker.write(dest, {"sets": ["val2017"], "subset": 0, "files": 1})
    item = _item(server, image_zip, sha256)
    seen = []
    real_fetch = Downloader.item

    def fetch(self, it):
        seen.append(Path(dest, marker.MARKER).exists())  # while files are fetched, there is no marker
        return real_fetch(self, it)

    monkeypatch.setattr(Downloader, "item", fetch)
    assert Downloader(args).run([item], []) == 0
    assert seen == [False]
    assert marker.read(dest)["items"] == ["val2017.zip"]


def test_noop_rerun_keeps_and_rewrites_the_marker(server, image_zip, sha256, make_args, monkeypatch):
    args = make_args()
    item = _item(server, image_zip, sha256)
    assert Downloader(args).run([item], []) == 0
    first = marker.read(args.dest)
    removed = []
    real_remove = marker.remove
    monkeypatch.setattr(marker, "remove", lambda root: removed.append(root) or real_remove(root))
    server.log.clear()
    assert Downloader(args).run([item], []) == 0
    assert server.log == [] and removed == []  # nothing to change: the marker was never taken away
    assert marker.read(args.dest)["files"] == first["files"]


def test_subset_run_counts_the_images(server, coco_annotations, make_args):
    args = make_args(subset=3, subset_seed=5)
    item = Item("annotations_trainval2017.zip", server.url + "/annotations/annotations_trainval2017.zip")
    assert Downloader(args).run([item], ["val2017"]) == 0
    body = marker.read(args.dest)
    assert (body["subset"], body["subset_seed"], body["files"]) == (3, 5, 4)
    # a subset image disappears: the next run will change the dataset, so it removes the marker first
    next(Path(args.dest, "val2017").iterdir()).unlink()
    downloader = Downloader(args)
    downloader.manifest = Manifest(Path(args.dest))
    assert downloader.pending([item], ["val2017"]) == ["subset of val2017"]
    assert Downloader(args).run([item], ["val2017"]) == 0 and marker.read(args.dest)["files"] == 4


def test_cli_writes_the_marker(server, image_zip, sha256, tmp_path, monkeypatch):
    server.files[PATH] = image_zip[1]
    urls = tmp_path / "urls.txt"
    urls.write_text(f"{server.url}{PATH} sha256:{sha256(image_zip[1])}\n")
    for name in [k for k in os.environ if k.startswith("DOWNLOAD_")]:
        monkeypatch.delenv(name)
    dest = tmp_path / "data"
    code = download_main(["--dest", str(dest), "--urls-file", str(urls), "--progress", "off", "--backoff-s", "0"])
    assert code == 0
    body = marker.read(dest)
    assert body["sets"] == [] and body["source"] == str(urls) and body["files"] == 1


@pytest.mark.parametrize(
    ("text", "words"),
    [("{not json", "not valid JSON"), ('{"complete": false}', "complete=true"), ("[1]", "JSON object")],
)
def test_broken_markers_are_errors(tmp_path, text, words):
    Path(tmp_path, marker.MARKER).write_text(text)
    with pytest.raises(marker.MarkerError, match=words):
        marker.read(tmp_path)
