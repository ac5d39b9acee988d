"""Checkpoints: own round trip, official layout with argparse args, fine-tuning re-head, unsafe files refused."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dinops.model import DINOConfig, build_dino, load_checkpoint, save_checkpoint
from dinops.model.checkpoint import UnsafeCheckpointError, config_from_checkpoint


def _same_outputs(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    images, mask = torch.randn(1, 3, 64, 64), torch.zeros(1, 64, 64, dtype=torch.bool)
    with torch.no_grad():
        return torch.equal(a.eval()(images, mask)["pred_logits"], b.eval()(images, mask)["pred_logits"])


def test_own_checkpoint_round_trip(
    tmp_path: Path, tiny_model: torch.nn.Module, tiny_config: Callable[..., DINOConfig]
) -> None:
    path = tmp_path / "ckpt" / "checkpoint.pth"
    save_checkpoint(path, tiny_model, tiny_config(), epoch=3)
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.pth"]  # no temp file left behind
    assert config_from_checkpoint(path) == tiny_config()
    torch.manual_seed(1)
    fresh = build_dino(config_from_checkpoint(path))
    report = load_checkpoint(fresh, path)
    assert (report.missing_keys, report.unexpected_keys, report.dropped_keys) == ([], [], [])
    assert _same_outputs(fresh, tiny_model)


def test_official_layout_with_namespace_args_and_ddp_prefix(
    tmp_path: Path, tiny_model: torch.nn.Module, tiny_config: Callable[..., DINOConfig]
) -> None:
    args = argparse.Namespace(**tiny_config().to_dict(), coco_path="/data/coco", lr=1e-4)
    state = {f"module.{k}": v for k, v in tiny_model.state_dict().items()}
    path = tmp_path / "checkpoint0011_4scale.pth"
    torch.save({"model": state, "optimizer": {"state": {}}, "epoch": 11, "args": args}, path)
    fresh = build_dino(config_from_checkpoint(path))
    report = load_checkpoint(fresh, path)
    assert report.missing_keys == [] and report.args["coco_path"] == "/data/coco"
    assert _same_outputs(fresh, tiny_model)


def test_fine_tuning_drops_class_heads(
    tmp_path: Path,
    tiny_model: torch.nn.Module,
    tiny_config: Callable[..., DINOConfig],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "three_classes.pth"
    save_checkpoint(path, tiny_model, tiny_config())
    torch.manual_seed(5)
    model = build_dino(tiny_config(num_classes=2))
    fresh_head = model.class_embed[0].weight.detach().clone()
    with caplog.at_level(logging.WARNING, logger="dinops.model.checkpoint"):
        report = load_checkpoint(model, path)
    assert report.checkpoint_num_classes == 3
    assert "has 3 classes, the model 2" in caplog.text
    assert all("class_embed" in k or k == "label_enc.weight" for k in report.dropped_keys)
    assert "label_enc.weight" in report.dropped_keys and "transformer.enc_out_class_embed.weight" in report.dropped_keys
    assert sorted(report.missing_keys) == report.dropped_keys
    assert torch.equal(model.class_embed[0].weight, fresh_head)
    assert torch.equal(model.bbox_embed[0].layers[0].weight, tiny_model.bbox_embed[0].layers[0].weight)
    assert torch.equal(
        model.backbone[0].body.layer4[0].conv1.weight, tiny_model.backbone[0].body.layer4[0].conv1.weight
    )


def test_other_shape_mismatch_is_an_error(
    tmp_path: Path, tiny_model: torch.nn.Module, tiny_config: Callable[..., DINOConfig]
) -> None:
    path = tmp_path / "ckpt.pth"
    save_checkpoint(path, tiny_model)
    with pytest.raises(ValueError, match="shape mismatches"):
        load_checkpoint(build_dino(tiny_config(dim_feedforward=32)), path)


class _RunsCode:
    """Unpickling this calls exec(): what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_unsafe_checkpoint_is_refused_and_runs_nothing(tmp_path: Path, tiny_model: torch.nn.Module) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pth"
    torch.save({"model": {}, "payload": _RunsCode(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match="refusing to load"):
        load_checkpoint(tiny_model, path)
    assert not marker.exists()


def test_missing_and_foreign_files(tmp_path: Path, tiny_model: torch.nn.Module) -> None:
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tiny_model, tmp_path / "nope.pth")
    path = tmp_path / "list.pth"
    torch.save([1, 2, 3], path)
    with pytest.raises(ValueError, match="expected a dict"):
        load_checkpoint(tiny_model, path)
