"""DINOConfig: official args in, unknown keys out, presets, clear errors for what is not supported."""

from __future__ import annotations

import argparse

import pytest

from dinops.model import DINOConfig, build_dino


def test_from_official_ignores_unknown_and_private_keys() -> None:
    cfg = DINOConfig.from_official(
        {"num_classes": 7, "hidden_dim": 128, "coco_path": "/data", "_weights": {"seed": 1}, "lr": 0.1}
    )
    assert cfg.num_classes == 7
    assert cfg.hidden_dim == 128
    assert cfg.num_queries == 900


def test_from_official_accepts_a_namespace_and_tuples() -> None:
    cfg = DINOConfig.from_official(argparse.Namespace(return_interm_indices=(0, 1, 2, 3), num_feature_levels=5))
    assert cfg == DINOConfig.dino_5scale_r50()


def test_small_reference_config(small_args: dict) -> None:
    cfg = DINOConfig.from_official(small_args)
    assert (cfg.enc_layers, cfg.dec_layers, cfg.num_queries, cfg.num_classes, cfg.dn_labelbook_size) == (
        2,
        2,
        20,
        10,
        91,
    )


def test_to_dict_round_trip() -> None:
    cfg = DINOConfig.dino_5scale_r50().replace(num_classes=3)
    assert DINOConfig.from_official(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"two_stage_type": "combine"}, "two_stage_type"),
        ({"backbone": "swin_T_224_1k"}, "backbone"),
        ({"num_feature_levels": 2}, "num_feature_levels"),
        ({"return_interm_indices": [3, 1]}, "return_interm_indices"),
        ({"hidden_dim": 100}, "hidden_dim"),
        ({"num_patterns": 2}, "num_patterns"),
        ({"backbone": "resnet18", "dilation": True}, "dilation"),
        ({"two_stage_class_embed_share": True, "dec_pred_class_embed_share": False}, "two_stage"),
    ],
)
def test_unsupported_values_are_named(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_dino(DINOConfig().replace(**changes))
