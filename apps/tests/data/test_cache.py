"""The local decoded-image cache (dinops.data.cache): fill, resume, verification, invalidation, bound, reuse."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from dinops.data import cache as cache_mod
from dinops.data.cache import COMPLETE, CacheBudget, CorruptEntry, entry_bytes, fill, read_entry, write_entry
from dinops.data.coco import CocoDetection
from dinops.data.loader import collate
from dinops.data.synth import SynthSpec, generate
from dinops.train import cache_command

SIDE = 64
ENTRY = entry_bytes(SIDE, SIDE)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return generate(SynthSpec(train_images=10, val_images=4, image_size=SIDE, seed=5), tmp_path_factory.mktemp("s"))


@pytest.fixture
def data(tmp_path, pristine):
    """A private copy of the dataset: tests replace its files."""
    return shutil.copytree(pristine, tmp_path / "data")


@pytest.fixture
def decodes(monkeypatch):
    """Every decode from the source, by image id (thread-safe; forked loader workers keep their own)."""
    seen: list[int] = []
    lock = threading.Lock()
    original = CocoDetection.decode_source

    def counting(self, img):
        with lock:
            seen.append(img["id"])
        return original(self, img)

    monkeypatch.setattr(CocoDetection, "decode_source", counting)
    return seen


def split(data, name="train2017", cache_dir=None, budget=None, transforms=None):
    ann = data / "annotations" / f"instances_{name}.json"
    return CocoDetection(data / name, ann, transforms, cache_dir=cache_dir, cache_budget=budget)


def run_cli(capsys, *argv):
    status = cache_command.main(list(argv))
    return status, capsys.readouterr().err


def entries(cache_dir):
    return sorted(p.name for p in cache_dir.rglob("*.img"))


def test_entry_round_trip_and_every_kind_of_damage_is_detected(tmp_path):
    array = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    path = tmp_path / "1.img"
    write_entry(path, array)
    assert np.array_equal(read_entry(path), array) and read_entry(path).flags.writeable
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[-1] ^= 1
    for damaged, why in [(good[:-10], "truncated"), (good[:10], "truncated header"), (bytes(flipped), "checksum")]:
        path.write_bytes(damaged)
        with pytest.raises(CorruptEntry, match=why):
            read_entry(path)
    path.write_bytes(good + b"x")
    with pytest.raises(CorruptEntry, match="too long"):
        read_entry(path)


def test_cli_fills_both_splits_in_parallel_with_progress_and_a_marker(tmp_path, data, capsys, decodes):
    cache_dir = tmp_path / "cache"
    status, err = run_cli(capsys, "--data-root", str(data), "--cache-dir", str(cache_dir), "--workers", "3")
    assert status == 0, err
    assert "train2017 10/10 images" in err and "images/s, ETA" in err
    assert len(entries(cache_dir)) == 14 and sorted(decodes) == sorted(set(decodes)) and len(decodes) == 14
    train = split(data, cache_dir=cache_dir)
    assert train.cache.complete
    marker = json.loads((train.cache.root / COMPLETE).read_text())
    ann = data / "annotations" / "instances_train2017.json"
    assert marker["count"] == 10 and marker["bytes"] == 10 * ENTRY and marker["format"] == cache_mod.FORMAT
    assert marker["identity"]["annotations"]["sha256"] == hashlib.sha256(ann.read_bytes()).hexdigest()
    first = train.images[0]
    cached = read_entry(train.cache.path(first["id"]))
    assert np.array_equal(cached, np.array(Image.open(data / "train2017" / first["file_name"]).convert("RGB")))
    decodes.clear()
    status, err = run_cli(capsys, "--data-root", str(data), "--cache-dir", str(cache_dir))
    assert status == 0 and err.count("nothing to do") == 2 and decodes == []


def test_an_interrupted_fill_resumes_with_what_is_missing(tmp_path, data, capsys, monkeypatch, decodes):
    cache_dir = tmp_path / "cache"
    counting = CocoDetection.decode_source

    def interrupted(self, img):
        if len(decodes) >= 4:
            raise KeyboardInterrupt  # Ctrl-C or a killed pod: no marker is written
        return counting(self, img)

    monkeypatch.setattr(CocoDetection, "decode_source", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fill(split(data, cache_dir=cache_dir), workers=1)
    assert len(entries(cache_dir)) == 4 and not (split(data, cache_dir=cache_dir).cache.complete)
    monkeypatch.setattr(CocoDetection, "decode_source", counting)
    report = fill(split(data, cache_dir=cache_dir), workers=2)
    assert (report.kept, report.decoded, report.failed) == (4, 6, [])
    assert split(data, cache_dir=cache_dir).cache.complete


def test_a_corrupt_entry_is_decoded_again_and_rewritten(tmp_path, data, decodes, caplog):
    cache_dir = tmp_path / "cache"
    fill(split(data, cache_dir=cache_dir), workers=2)
    ds = split(data, cache_dir=cache_dir)
    truncated, flipped = ds.images[1]["id"], ds.images[2]["id"]
    path = ds.cache.path(truncated)
    path.write_bytes(path.read_bytes()[:-100])
    raw = bytearray(ds.cache.path(flipped).read_bytes())
    raw[200] ^= 0xFF
    ds.cache.path(flipped).write_bytes(bytes(raw))
    decodes.clear()
    with caplog.at_level(logging.WARNING, logger="dinops.data.cache"):
        images = [ds[i][0] for i in range(len(ds))]
    assert sorted(decodes) == sorted([truncated, flipped])
    assert "truncated" in caplog.text and "checksum mismatch" in caplog.text
    plain = split(data)
    assert all(torch.equal(image, plain[i][0]) for i, image in enumerate(images))
    assert np.array_equal(read_entry(path), plain[1][0].permute(1, 2, 0).numpy())  # rewritten whole


@pytest.mark.parametrize("change", ["image replaced", "annotations edited"])
def test_a_changed_source_invalidates_the_cache(tmp_path, data, decodes, change):
    cache_dir = tmp_path / "cache"
    fill(split(data, cache_dir=cache_dir), workers=2)
    ds = split(data, cache_dir=cache_dir)
    img = ds.images[0]
    if change == "image replaced":
        source = data / "train2017" / img["file_name"]
        Image.open(source).transpose(Image.Transpose.ROTATE_180).save(source, quality=95)
    else:
        ann = data / "annotations" / "instances_train2017.json"
        document = json.loads(ann.read_text())
        document["annotations"] = document["annotations"][1:]
        ann.write_text(json.dumps(document))
    decodes.clear()
    again = split(data, cache_dir=cache_dir)
    assert not again.cache.complete and entries(cache_dir) == []
    pixels = again[0][0]
    assert decodes == [img["id"]] and torch.equal(pixels, split(data)[0][0])


@pytest.mark.parametrize("how", ["rewritten in place", "replaced by rename"])
def test_a_same_size_rewrite_that_keeps_the_mtime_invalidates_the_cache(tmp_path, data, decodes, how):
    """`exiftool -P` (in place) or `rsync -a`/`cp -p` (a new file renamed over) keep name, size and mtime: the
    inode number and the ctime, which no tool can set, still tell (audit round 2, finding 24)."""
    cache_dir = tmp_path / "cache"
    source = data / "train2017" / split(data).images[0]["file_name"]
    original = source.read_bytes()
    buffer = io.BytesIO()
    Image.open(source).transpose(Image.Transpose.ROTATE_180).save(buffer, format="JPEG", quality=95)
    rotated = buffer.getvalue()
    # Equal sizes: JPEG decoders ignore what follows the end-of-image marker.
    size = max(len(original), len(rotated))
    source.write_bytes(original.ljust(size, b"\0"))
    fill(split(data, cache_dir=cache_dir), workers=2)
    before = source.stat()
    # File times come from a coarse clock (a jiffy): the rewrite must be in a later tick than the original.
    time.sleep(0.05)
    if how == "rewritten in place":
        with open(source, "r+b") as fh:
            fh.write(rotated.ljust(size, b"\0"))
    else:
        copy = source.with_name(source.name + ".tmp")
        copy.write_bytes(rotated.ljust(size, b"\0"))
        copy.replace(source)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = source.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    decodes.clear()
    again = split(data, cache_dir=cache_dir)
    assert not again.cache.complete and entries(cache_dir) == []
    pixels = again[0][0]
    assert decodes == [again.images[0]["id"]] and torch.equal(pixels, split(data)[0][0])


def test_the_size_bound_holds_training_split_first_smallest_images_first(tmp_path, data, capsys):
    cache_dir = tmp_path / "cache"
    gb = 5.5 * ENTRY / 1e9  # five entries fit
    status, err = run_cli(capsys, "--data-root", str(data), "--cache-dir", str(cache_dir), "--cache-max-gb", str(gb))
    assert status == 0, err
    assert "(5 of 10 images fit the bound)" in err and "(0 of 4 images fit the bound)" in err  # val: the rest
    train = split(data, cache_dir=cache_dir, budget=CacheBudget(gb))
    ids = sorted(img["id"] for img in train.images)
    assert entries(cache_dir) == sorted(f"{i}.img" for i in ids[:5])  # equal sizes: the lowest ids
    assert sum(p.stat().st_size for p in cache_dir.rglob("*.img")) <= gb * 1e9
    assert train.cache.complete
    for i in range(len(train)):  # images outside the plan are read from the source and never written
        train[i]
    assert len(entries(cache_dir)) == 5
    smaller = split(data, cache_dir=cache_dir, budget=CacheBudget(2.5 * ENTRY / 1e9))  # a lowered bound evicts
    assert entries(cache_dir) == sorted(f"{i}.img" for i in ids[:2]) and not smaller.cache.complete


def test_budget_prefers_small_images_and_serves_splits_in_order():
    budget = CacheBudget(10 / 1e9)
    assert budget.plan("train", {1: 6, 2: 3, 3: 3, 4: 9}) == {2, 3}
    assert budget.plan("val", {7: 4, 8: 5}) == {7}
    assert budget.plan("train", {1: 6, 2: 3, 3: 3, 4: 9}) == {2, 3}  # the same split is planned once


def test_training_loaders_read_a_filled_cache_without_decoding(tmp_path, data, capsys, monkeypatch):
    from dinops.train.main import build_loaders, parse_args

    cache_dir = tmp_path / "cache"
    assert run_cli(capsys, "--data-root", str(data), "--cache-dir", str(cache_dir))[0] == 0

    def no_decoding(self, img):
        raise AssertionError(f"decoded {img['file_name']} although it is cached")

    monkeypatch.setattr(CocoDetection, "decode_source", no_decoding)  # inherited by the forked workers
    args = parse_args(
        ["--data-root", str(data), "--cache-dir", str(cache_dir), "--device", "cpu", "--num-workers", "2"], {}
    )
    args.train_scales_list, args.max_size, args.eval_size = [64], 96, 64
    train_set, val_set, train_loader, val_loader = build_loaders(args, 1, 0, torch.device("cpu"))
    assert train_set.cache.complete and val_set.cache.complete
    seen = [t["image_id"] for _, _, targets in [*train_loader, *val_loader] for t in targets]
    assert len(seen) == 10 // args.batch_size * args.batch_size + 4


def test_training_fills_the_cache_lazily_from_loader_workers(tmp_path, data, decodes):
    cache_dir = tmp_path / "cache"
    ds = split(data, cache_dir=cache_dir)
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate)
    first = [images for images, _, _ in loader]
    assert len(entries(cache_dir)) == 10 and not ds.cache.complete  # only `dinops cache` writes the marker
    ds2 = split(data, cache_dir=cache_dir)
    decodes.clear()
    second = [images for images, _, _ in torch.utils.data.DataLoader(ds2, batch_size=2, collate_fn=collate)]
    assert decodes == [] and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_process_pool_fills_the_same_entries(tmp_path, data):
    a, b = tmp_path / "threads", tmp_path / "processes"
    fill(split(data, cache_dir=a), workers=2, pool="thread")
    report = fill(split(data, cache_dir=b), workers=2, pool="process")
    assert report.decoded == 10 and split(data, cache_dir=b).cache.complete
    assert [p.read_bytes() for p in sorted(a.rglob("*.img"))] == [p.read_bytes() for p in sorted(b.rglob("*.img"))]


@pytest.mark.parametrize(
    "case,message",
    [
        ("missing data root", "no annotation file (set --data-root / DINO_DATA_ROOT '/nonexistent/coco'"),
        ("cache dir under a file", "--cache-dir / DINO_CACHE_DIR"),
        ("no cache dir", "--cache-dir / DINO_CACHE_DIR is empty"),
        ("disk too small", "bound the cache with --cache-max-gb / DINO_CACHE_MAX_GB"),
        ("negative bound", "DINO_CACHE_MAX_GB='-1' is not valid for --cache-max-gb: must not be negative"),
        ("unknown variable", "unknown setting(s) in the environment: DINO_CACHE_MAX_GIB"),
    ],
)
def test_cli_errors_name_the_setting(tmp_path, data, capsys, monkeypatch, case, message):
    argv = ["--data-root", str(data), "--cache-dir", str(tmp_path / "cache")]
    if case == "missing data root":
        argv[1] = "/nonexistent/coco"
    elif case == "cache dir under a file":
        (tmp_path / "file").write_text("")
        argv[3] = str(tmp_path / "file" / "cache")
    elif case == "no cache dir":
        argv = argv[:2]
    elif case == "disk too small":
        monkeypatch.setattr(cache_mod, "MIN_FREE_BYTES", shutil.disk_usage(tmp_path).free)
    elif case == "negative bound":
        monkeypatch.setenv("DINO_CACHE_MAX_GB", "-1")
    else:
        monkeypatch.setenv("DINO_CACHE_MAX_GIB", "1")
    status, err = run_cli(capsys, *argv)
    assert status == 2 and message in err, err
