"""Atomic extraction, subset mode and the command line of the downloader."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from dinops.download import extract
from dinops.download.cli import Downloader, main, plan
from dinops.download.manifest import FILE as MANIFEST
from dinops.download.sources import COCO, Item, SourceError, read_checksum_file, read_urls


def _served(server, path, data, digests=True):
    server.files[path] = data
    name = path.rsplit("/", 1)[1]
    return Item(name, server.url + path, {"md5": hashlib.md5(data).hexdigest()} if digests else {})


def test_foreign_folder_is_never_overwritten(server, image_zip, make_args):
    args = make_args()
    mine = Path(args.dest, "val2017")
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("my own work")
    assert Downloader(args).run([_served(server, "/val2017.zip", image_zip[1])], []) == 1
    assert (mine / "notes.txt").read_text() == "my own work" and len(list(mine.iterdir())) == 1
    assert Path(args.dest, ".downloads", "val2017.zip").is_file()  # kept: the next run needs no download


def test_failed_extraction_leaves_no_folder(server, make_zip, make_args):
    data = bytearray(make_zip({"val2017/a.jpg": b"A" * 1000, "val2017/b.jpg": b"B" * 1000}))
    data[data.index(b"B" * 1000) + 10] ^= 0xFF  # CRC mismatch in the second member
    args = make_args()
    assert Downloader(args).run([_served(server, "/val2017.zip", bytes(data))], []) == 1
    assert sorted(p.name for p in Path(args.dest).iterdir()) == [".dinops-download.json", ".downloads"]


def test_interrupted_extraction_is_redone(server, image_zip, make_args):
    args = make_args(keep_archives=True)
    item = _served(server, "/val2017.zip", image_zip[1])
    assert Downloader(args).run([item], []) == 0
    # as if killed between renames: the manifest says extracting, a leftover temp dir exists, one file is gone
    manifest_path = Path(args.dest, MANIFEST)
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["val2017.zip"] = {**manifest["files"]["val2017.zip"], "state": "extracting", "tops": ["val2017"]}
    manifest_path.write_text(json.dumps(manifest))
    next(Path(args.dest, "val2017").iterdir()).unlink()
    Path(args.dest, ".extract-val2017-1").mkdir()
    server.log.clear()
    assert Downloader(args).run([item], []) == 0
    assert server.log == []  # the kept, verified archive was reused
    assert len(list(Path(args.dest, "val2017").iterdir())) == len(image_zip[0])
    assert not Path(args.dest, ".extract-val2017-1").exists()


@pytest.mark.parametrize("member", ["../evil.txt", "/etc/evil.txt"])
def test_unsafe_member_names_are_refused(tmp_path, member):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(zipfile.ZipInfo(member), b"x")
    with pytest.raises(extract.ExtractError, match="unsafe member name"):
        extract.extract_zip(archive, tmp_path / "out")


def test_subset_fetches_only_chosen_images_and_writes_a_new_file(server, coco_annotations, make_args):
    document, files, archive = coco_annotations
    args = make_args(subset=3, subset_seed=5)
    item = Item("annotations_trainval2017.zip", server.url + "/annotations/annotations_trainval2017.zip")
    assert Downloader(args).run([item], ["val2017"]) == 0
    annotations = Path(args.dest, "annotations")
    assert json.loads((annotations / "instances_val2017.json").read_text()) == document  # untouched
    written = json.loads((annotations / "instances_val2017_subset3_seed5.json").read_text())
    chosen = [image["file_name"] for image in written["images"]]
    assert len(chosen) == 3 and sorted(p.name for p in Path(args.dest, "val2017").iterdir()) == sorted(chosen)
    for name in chosen:
        assert Path(args.dest, "val2017", name).read_bytes() == files[name]
    ids = {image["id"] for image in written["images"]}
    assert {a["image_id"] for a in written["annotations"]} == ids and len(written["annotations"]) == 6
    assert written["categories"] == document["categories"]

    server.log.clear()
    assert Downloader(args).run([item], ["val2017"]) == 0
    assert server.log == []
    again = make_args(subset=3, subset_seed=5, dest=str(Path(args.dest).parent / "other"))
    assert Downloader(again).run([item], ["val2017"]) == 0
    assert json.loads(Path(again.dest, "annotations", "instances_val2017_subset3_seed5.json").read_text()) == written


def test_plan_in_subset_mode_swaps_image_archives_for_annotations(make_args):
    items, splits = plan(make_args(subset=10, sets="train2017,val2017"))
    assert [i.name for i in items] == ["annotations_trainval2017.zip"] and splits == ["train2017", "val2017"]
    items, splits = plan(make_args())
    assert [i.url for i in items] == [COCO["train2017"].url, COCO["val2017"].url, COCO["annotations"].url]
    assert all(set(i.digests) == {"md5", "sha256"} for i in items) and splits == []


def test_url_list_and_checksum_files(tmp_path, make_args):
    urls = tmp_path / "urls.txt"
    urls.write_text(
        "# my data\nhttp://h/a.zip sha256:" + "ab" * 32 + "\nhttps://h/b.tar  " + "cd" * 16 + "\nhttp://h/c.bin\n"
    )
    items = read_urls(urls)
    assert [(i.name, i.digests) for i in items] == [
        ("a.zip", {"sha256": "ab" * 32}),
        ("b.tar", {"md5": "cd" * 16}),
        ("c.bin", {}),
    ]
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(f"{'ef' * 32}  c.bin\n{'01' * 32} *a.zip\n")
    assert read_checksum_file(sums) == {"c.bin": {"sha256": "ef" * 32}, "a.zip": {"sha256": "01" * 32}}
    items, _ = plan(make_args(urls_file=str(urls), checksum_file=str(sums)))
    assert items[0].digests == {"sha256": "01" * 32} and items[2].digests == {"sha256": "ef" * 32}
    assert plan(make_args(urls_file=str(urls), checksum_file=str(sums), require_checksums=True))[0] == items
    with pytest.raises(SourceError, match=r"no checksum for c.bin \(--require-checksums\)"):
        plan(make_args(urls_file=str(urls), require_checksums=True))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ftp://h/a.zip\n", "not an http(s) URL"),
        ("http://h/a.zip md5:xyz\n", "not a hexadecimal checksum"),
        ("http://h/a.zip sha256:abcd\n", "not an md5, sha1, sha256 or sha512 checksum"),
        ("http://h/a.zip\nhttp://g/a.zip\n", "same file name: a.zip"),
        ("# nothing\n", "no URLs"),
    ],
)
def test_bad_url_lists_are_usage_errors(tmp_path, capsys, monkeypatch, text, message):
    urls = tmp_path / "urls.txt"
    urls.write_text(text)
    monkeypatch.setenv("DOWNLOAD_URLS_FILE", str(urls))
    assert main(["--dest", str(tmp_path / "d")]) == 2
    assert message in capsys.readouterr().err


def test_cli_help_unknown_env_and_checksums(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "DOWNLOAD_CONNECTIONS" in capsys.readouterr().out
    monkeypatch.setenv("DOWNLOAD_CONECTIONS", "8")
    assert main([]) == 2
    assert "DOWNLOAD_CONECTIONS" in capsys.readouterr().err
    monkeypatch.delenv("DOWNLOAD_CONECTIONS")
    sample = tmp_path / "x.bin"
    sample.write_bytes(b"abc")
    assert main(["--print-checksums", str(sample)]) == 0
    assert capsys.readouterr().out.split() == [
        "md5:900150983cd24fb0d6963f7d28e17f72",
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "x.bin",
    ]


def test_docs_list_every_setting():
    from dinops.download.settings import SETTINGS
    from dinops.settings import markdown_table

    text = (Path(__file__).resolve().parents[3] / "docs" / "download.md").read_text()
    documented = text.split("<!-- settings:download -->\n", 1)[1].split("\n<!-- /settings:download -->", 1)[0]
    assert documented == markdown_table(SETTINGS), "regenerate the table in docs/download.md"


def test_downloader_imports_neither_torch_nor_flask():
    import subprocess
    import sys

    code = "import sys, dinops.download.cli; print(sorted({'torch', 'flask', 'PIL'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
