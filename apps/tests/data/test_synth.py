from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
from PIL import Image

from dinops.data import synth
from dinops.data.coco import load_annotations
from dinops.data.synth import CATEGORIES, SynthSpec, generate, main
from dinops.download import marker


def _digest(root):
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != marker.MARKER):  # it holds a time
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_layout_and_valid_annotations(synth_root):
    for split, count, first_id in (("train2017", 12, 1), ("val2017", 4, 100_001)):
        doc = load_annotations(synth_root / "annotations" / f"instances_{split}.json", synth_root / split)
        assert len(doc["images"]) == count
        assert doc["images"][0]["id"] == first_id
        assert [c["name"] for c in doc["categories"]] == [name for name, _ in CATEGORIES[:4]]
        assert {a["category_id"] for a in doc["annotations"]} <= {1, 2, 3, 4}
        per_image = {img["id"]: 0 for img in doc["images"]}
        for a in doc["annotations"]:
            per_image[a["image_id"]] += 1
            x, y, w, h = a["bbox"]
            assert x >= 0 and y >= 0 and x + w <= 96 and y + h <= 96 and w >= 8 and h >= 8
        assert min(per_image.values()) >= 1 and max(per_image.values()) <= SynthSpec().max_objects


def test_same_arguments_same_bytes(tmp_path):
    spec = SynthSpec(train_images=3, val_images=2, image_size=64, categories=2, seed=7)
    a, b = generate(spec, tmp_path / "a"), generate(spec, tmp_path / "b")
    assert _digest(a) == _digest(b)
    c = generate(SynthSpec(train_images=3, val_images=2, image_size=64, categories=2, seed=8), tmp_path / "c")
    assert _digest(a) != _digest(c)


def test_shapes_are_drawn_inside_their_boxes(synth_root):
    doc = json.loads((synth_root / "annotations" / "instances_train2017.json").read_text())
    ann = next(a for a in doc["annotations"] if a["category_id"] == 2 and a["bbox"][2] >= 16)  # a blue square
    image = np.asarray(Image.open(synth_root / "train2017" / f"{ann['image_id']:012d}.jpg"), dtype=np.int32)
    x, y, w, h = (int(v) for v in ann["bbox"])
    centre = image[y + h // 2, x + w // 2]
    assert centre[2] > centre[0] + 60  # blue dominates where the square is (unless occluded, which the seed avoids)


def test_cli_rejects_bad_arguments(tmp_path, caplog):
    assert main(["--out", str(tmp_path / "x"), "--categories", "99"]) == 2
    assert "--categories must be between 1 and 8" in caplog.text
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("field,value", [("min_objects", 0), ("max_occlusion", 1.5), ("image_size", 8)])
def test_spec_check(field, value):
    with pytest.raises(ValueError):
        SynthSpec(**{field: value}).check()


SMALL = SynthSpec(train_images=3, val_images=2, image_size=64, categories=3, seed=2)


def _argv(out, spec: SynthSpec = SMALL) -> list[str]:
    argv = ["--out", str(out)]
    for name, value in asdict(spec).items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def _mtimes(root) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_writes_the_completion_marker_last_and_data_ready_passes(tmp_path):
    root = tmp_path / "data"
    assert main(_argv(root)) == 0
    body = marker.read(root)
    assert body["source"] == "synthetic" and body["synthetic"] is True and body["complete"] is True
    assert body["spec"] == asdict(SMALL) and body["sets"] == ["train2017", "val2017"] and body["files"] == 3 + 2 + 2
    times = _mtimes(root)
    assert max(times.values()) == times[marker.MARKER]  # written last
    assert not [p for p in root.rglob("*.tmp")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")}
    done = subprocess.run(
        [sys.executable, "-m", "dinops.cli", "data-ready", "--data-root", str(root), "--wait", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"the dataset is complete: {marker.path(root)}")


def test_the_same_spec_again_changes_nothing_and_says_so(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="dinops.data.synth")
    root = tmp_path / "data"
    assert main(_argv(root)) == 0
    before = _mtimes(root)
    monkeypatch.setattr(synth, "write_split", lambda *a: pytest.fail("rewrote a split of a complete dataset"))
    assert main(_argv(root)) == 0
    assert _mtimes(root) == before
    assert "already holds this dataset" in caplog.text and "nothing to do" in caplog.text


def test_another_spec_removes_the_marker_first_and_writes_it_again(tmp_path, monkeypatch):
    root = tmp_path / "data"
    assert main(_argv(root, SynthSpec(train_images=5, val_images=2, image_size=64, categories=3, seed=2))) == 0
    seen = []
    write_split = synth.write_split

    def spy(spec, out, split):
        seen.append(marker.path(out).exists())
        return write_split(spec, out, split)

    monkeypatch.setattr(synth, "write_split", spy)
    assert main(_argv(root)) == 0
    assert seen == [False, False]  # no split was written under a marker that claimed the old dataset
    assert marker.read(root)["spec"] == asdict(SMALL)
    assert len(list((root / "train2017").glob("*.jpg"))) == 3  # the old spec's extra images are gone
    assert _digest(root) == _digest(generate(SMALL, tmp_path / "fresh"))


def test_a_marker_over_an_incomplete_dataset_regenerates_it(tmp_path):
    root = tmp_path / "data"
    assert main(_argv(root)) == 0
    victim = sorted((root / "val2017").glob("*.jpg"))[0]
    victim.unlink()
    assert main(_argv(root)) == 0
    assert victim.is_file() and marker.read(root)["spec"] == asdict(SMALL)


def test_refuses_a_folder_that_holds_a_downloaded_dataset(tmp_path, caplog):
    marker.write(tmp_path, {"sets": ["val2017"], "source": "coco", "files": 1})
    assert main(_argv(tmp_path)) == 2
    assert "holds another dataset (source 'coco')" in caplog.text and "choose another --out" in caplog.text
    assert marker.read(tmp_path)["source"] == "coco" and not (tmp_path / "train2017").exists()
