from __future__ import annotations

import json
from pathlib import Path

import pytest

from dinops.settings import SettingsError, markdown_table
from dinops.train.main import main, parse_args
from dinops.train.settings import SETTINGS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "training.md"


def test_precedence_flag_env_default():
    env = {"DINO_LR": "0.0002", "DINO_EPOCHS": "3"}
    args = parse_args(["--epochs", "5"], env)
    assert args.epochs == 5  # flag beats environment
    assert args.lr == 0.0002  # environment beats default
    assert args.batch_size == 2  # default
    assert args.train_annotations == "data/coco/annotations/instances_train2017.json"


def test_unknown_environment_variable_is_an_error():
    with pytest.raises(SettingsError, match="DINO_LEARNING_RATE"):
        parse_args([], {"DINO_LEARNING_RATE": "1e-4"})


@pytest.mark.parametrize(
    "argv,env,message",
    [
        ([], {"DINO_BATCH_SIZE": "two"}, "DINO_BATCH_SIZE='two' is not valid for --batch-size"),
        (["--amp", "fp16", "--device", "cpu"], {}, "--amp fp16 needs a GPU"),
        (["--eval", "true"], {}, "--eval needs a model"),
        (["--crop-size", "600,384"], {}, "--crop-size needs two integers MIN,MAX"),
        (["--lr-drop", "11,x"], {}, "--lr-drop='11,x': expected comma-separated integers"),
        (["--pretrained", "/nonexistent.pth"], {}, "--pretrained /nonexistent.pth: no such file"),
        (["--accum-steps", "0"], {}, "--accum-steps must be >= 1"),
    ],
)
def test_unusable_values_are_named(argv, env, message):
    with pytest.raises(SettingsError) as err:
        parse_args(argv, env)
    assert message in str(err.value)


def test_train_refuses_a_bad_dataset_with_exit_2(tmp_path, small_synth, caplog, no_dino_env):
    doc = json.loads((small_synth / "annotations" / "instances_train2017.json").read_text())
    doc["annotations"][0]["category_id"] = 42
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code = main(
        [
            "--data-root",
            str(small_synth),
            "--train-annotations",
            str(bad),
            "--output-dir",
            str(tmp_path / "out"),
            "--device",
            "cpu",
        ]
    )
    assert code == 2
    assert "unknown category id 42" in caplog.text


def test_docs_hold_the_settings_table():
    assert markdown_table(SETTINGS) in DOCS.read_text()


def test_train_refuses_a_batch_larger_than_the_dataset(tmp_path, small_synth, caplog, no_dino_env):
    argv = ["--data-root", str(small_synth), "--output-dir", str(tmp_path), "--device", "cpu", "--batch-size", "9"]
    assert main(argv) == 2
    assert "the dataset has 8 images, fewer than one global batch (1 process(es) x batch 9)" in caplog.text


def test_the_models_own_setting_is_accepted_and_a_bad_value_stops_the_start():
    # DINO_DEFORM_ATTN is read by the model (dinops.model.ms_deform_attn_core), not by the app: a pod that sets it must
    # start, and a misspelt value must stop it at once rather than at the first forward pass.
    parse_args([], {"DINO_DEFORM_ATTN": "pure"})
    with pytest.raises(SettingsError, match="DINO_DEFORM_ATTN"):
        parse_args([], {"DINO_DEFORM_ATTN": "fast"})
