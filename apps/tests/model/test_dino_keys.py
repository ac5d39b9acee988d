"""The full official models: exact state_dict keys, shapes and dtypes, parameter counts, aliasing, frozen parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dinops.model import DINOConfig, build_dino


def read_key_list(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    entries = {}
    for line in path.read_text().splitlines():
        key, shape, dtype = line.split("\t")
        entries[key] = (tuple(int(s) for s in shape.split(",") if s), dtype)
    return entries


def owner_tensor(model: torch.nn.Module, key: str) -> torch.Tensor:
    """The parameter or buffer object behind a state_dict key (state_dict() returns fresh detached views)."""
    module_name, _, attr = key.rpartition(".")
    return getattr(model.get_submodule(module_name), attr)


def build_on_meta(cfg: DINOConfig) -> torch.nn.Module:
    with torch.device("meta"):
        return build_dino(cfg)


@pytest.mark.parametrize("scales", [4, 5])
def test_state_dict_matches_official_key_list(reference_dir: Path, scales: int) -> None:
    args = json.loads((reference_dir / f"official_{scales}scale_r50_config.json").read_text())
    cfg = DINOConfig.from_official(args)
    assert cfg == (DINOConfig.dino_4scale_r50() if scales == 4 else DINOConfig.dino_5scale_r50())
    expected = read_key_list(reference_dir / f"official_{scales}scale_r50_keys.txt")
    state = build_on_meta(cfg).state_dict()
    got = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()}
    assert sorted(set(expected) - set(got)) == []
    assert sorted(set(got) - set(expected)) == []
    assert {k: v for k, v in got.items() if v != expected[k]} == {}


def test_full_4scale_parameter_counts_and_sharing() -> None:
    model = build_on_meta(DINOConfig.dino_4scale_r50())
    params = list(model.parameters())  # unique tensors
    assert sum(p.numel() for p in params) == 46_893_182
    assert sum(p.numel() for p in params if p.requires_grad) == 46_670_782
    assert sum(b.numel() for b in model.buffers()) == 106_240
    state = model.state_dict()
    assert len(state) == 626
    assert len({id(owner_tensor(model, k)) for k in state}) == 538  # 88 alias entries of the shared heads
    shared = owner_tensor(model, "transformer.decoder.bbox_embed.0.layers.0.weight")
    assert owner_tensor(model, "bbox_embed.3.layers.0.weight") is shared
    assert owner_tensor(model, "transformer.enc_out_class_embed.weight") is not owner_tensor(
        model, "class_embed.0.weight"
    )
    frozen = {name.split(".")[3] for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"conv1", "layer1"}


def test_unshared_heads_have_their_own_tensors() -> None:
    cfg = DINOConfig.dino_4scale_r50().replace(dec_pred_bbox_embed_share=False, dec_pred_class_embed_share=False)
    model = build_on_meta(cfg)
    assert owner_tensor(model, "class_embed.0.weight") is not owner_tensor(model, "class_embed.1.weight")
    assert owner_tensor(model, "class_embed.1.weight") is owner_tensor(
        model, "transformer.decoder.class_embed.1.weight"
    )
