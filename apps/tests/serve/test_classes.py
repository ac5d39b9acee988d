"""Class names: COCO's ids with gaps, custom tables from files and checkpoints."""

from __future__ import annotations

import json

import pytest

from dinops.serve import classes


def test_coco_has_80_names_on_91_ids():
    names = classes.coco()
    assert len(classes.COCO_NAMES) == 80 and max(classes.COCO_NAMES) == 90
    assert (names[1], names[18], names[90]) == ("person", "dog", "toothbrush")
    assert names.ids == tuple(sorted(classes.COCO_NAMES)) and not {0, 12, 26, 83, 91} & set(names.ids)
    with pytest.raises(KeyError):
        names[12]
    assert names.id_of(" Teddy Bear ") == 88 and names.id_of("unicorn") is None


@pytest.mark.parametrize(
    ("filename", "content", "expected"),
    [
        ("names.json", json.dumps(["bg", "cat", "dog"]), {0: "bg", 1: "cat", 2: "dog"}),
        ("names.json", json.dumps({"3": "kite", "7": "boat"}), {3: "kite", 7: "boat"}),
        ("ann.json", json.dumps({"images": [], "categories": [{"id": 5, "name": "cone"}]}), {5: "cone"}),
        ("names.txt", "bg\ncat\n\ndog\n", {0: "bg", 1: "cat", 3: "dog"}),
    ],
)
def test_files(tmp_path, filename, content, expected):
    path = tmp_path / filename
    path.write_text(content)
    assert classes.from_file(path).table == expected


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"x": "cat"}), "integer class ids"),
        (json.dumps(3), "expected a list"),
    ],
)
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "names.json"
    path.write_text(content)
    with pytest.raises(classes.ClassNamesError, match=message):
        classes.from_file(path)
    with pytest.raises(classes.ClassNamesError, match="cannot read"):
        classes.from_file(tmp_path / "missing.json")


def test_checkpoint_names():
    assert classes.from_checkpoint({"model": {}, "class_names": ["a", "b"]}).table == {0: "a", 1: "b"}
    stored = {"model": {}, "args": {"categories": [{"id": 2, "name": "tree"}]}}
    assert classes.from_checkpoint(stored).table == {2: "tree"}
    assert classes.from_checkpoint({"model": {}, "args": {"lr": 1e-4}}) is None
