"""The fast inference path (dinops.model.inference) against the reference path it rearranges.

The official reference outputs at their tolerances are in test_dino_fidelity.py (``test_fast_path_*``); here each
rearrangement is checked on its own in float64, where float32 rounding cannot hide a wrong formula.
"""

from __future__ import annotations

import copy
import platform
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from dinops.model import DINOConfig, build_dino, load_checkpoint, save_checkpoint, set_deformable_attention_backend
from dinops.model import deformable_attention as attention
from dinops.model import inference as fast
from dinops.model import ms_deform_attn_core as core
from dinops.model.backbone import Backbone
from dinops.model.encoder import DeformableEncoderLayer


def _randomise_frozen_bn(module: nn.Module, seed: int = 0) -> None:
    """Batch norms that are not identities (fresh ones are), so that a wrong fold shows."""
    gen = torch.Generator().manual_seed(seed)
    for bn in module.modules():
        if isinstance(bn, FrozenBatchNorm2d):
            n = bn.weight.numel()
            bn.weight.copy_(torch.rand(n, generator=gen) + 0.5)
            bn.bias.copy_(torch.randn(n, generator=gen) * 0.1)
            bn.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
            bn.running_var.copy_(torch.rand(n, generator=gen) + 0.5)


@pytest.mark.parametrize(("name", "expected"), [("resnet18", 20), ("resnet50", 53)])
def test_folding_every_batch_norm_keeps_the_backbone_features(name: str, expected: int) -> None:
    """resnet18: stem + 8 blocks x 2 + 3 downsamples; resnet50: stem + 16 blocks x 3 + 4 downsamples."""
    torch.manual_seed(0)
    backbone = Backbone(name=name, return_interm_indices=[1, 2, 3]).double().eval()
    _randomise_frozen_bn(backbone)
    images = torch.randn(2, 3, 64, 96, dtype=torch.float64)
    with torch.no_grad():
        expected_features = backbone(images)
        folded = copy.deepcopy(backbone)
        assert fast.fold_frozen_batch_norm(folded) == expected
        assert not any(isinstance(m, FrozenBatchNorm2d) for m in folded.modules())
        got = folded(images)
    for a, b in zip(got, expected_features, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)


def _encoder_layer_inputs(batch: int = 2) -> tuple:
    gen = torch.Generator().manual_seed(3)
    shapes = [(9, 13), (5, 7), (3, 4), (2, 2)]
    tokens = sum(h * w for h, w in shapes)
    src = torch.randn(batch, tokens, 32, generator=gen, dtype=torch.float64)
    pos = torch.randn(batch, tokens, 32, generator=gen, dtype=torch.float64)
    ref = torch.rand(batch, tokens, len(shapes), 2, generator=gen, dtype=torch.float64) * 1.2 - 0.1
    mask = torch.zeros(batch, tokens, dtype=torch.bool)
    mask[1, -20:] = True  # padding in the second image
    return src, pos, ref, shapes, mask


@pytest.fixture(params=["gather", "grid_sample"])
def backend(request: pytest.FixtureRequest):
    set_deformable_attention_backend(request.param)
    yield request.param
    set_deformable_attention_backend(None)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64, 100_000])
def test_the_chunked_encoder_layer_equals_the_reference_layer(chunk_tokens: int, backend: str) -> None:
    torch.manual_seed(1)
    layer = DeformableEncoderLayer(
        d_model=32, d_ffn=48, dropout=0.0, activation="relu", n_levels=4, n_heads=4, n_points=3
    )
    for param in layer.parameters():  # the official init zeroes the offsets: sample somewhere
        nn.init.normal_(param, std=0.3)
    layer = layer.double().eval()
    inputs = _encoder_layer_inputs()
    with torch.no_grad():
        expected = layer(*inputs)
        layer.chunk_tokens = chunk_tokens
        assert layer.fast
        got = layer(*inputs)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_the_chunked_path_is_only_taken_for_inference(tiny_config: Callable[..., DINOConfig]) -> None:
    layer = DeformableEncoderLayer(
        d_model=32, d_ffn=48, dropout=0.0, activation="relu", n_levels=4, n_heads=4, n_points=3
    )
    layer.chunk_tokens = 8
    assert not layer.fast  # training mode
    layer.eval()
    assert not layer.fast  # autograd on: the reference path keeps the gradients
    with torch.no_grad():
        assert layer.fast
    layer.chunk_tokens = 0
    with torch.no_grad():
        assert not layer.fast


def test_gather_rows_computed_in_integers_equal_the_float_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables of 2**24 rows or more take the integer formula; force it on a small one."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 9), (4, 5), (2, 3)]
    value = torch.randn(2, sum(h * w for h, w in shapes), 2, 8, generator=gen)
    locations = torch.rand(2, 11, 2, len(shapes), 3, 2, generator=gen) * 1.4 - 0.2
    weights = torch.rand(2, 11, 2, len(shapes), 3, generator=gen)
    shortcut = core.ms_deform_attn_gather(value, shapes, locations.clone(), weights)
    monkeypatch.setattr(core, "FLOAT_ROWS_LIMIT", 0)
    integers = core.ms_deform_attn_gather(value, shapes, locations.clone(), weights)
    assert torch.equal(shortcut, integers)
    assert torch.allclose(integers, core.ms_deform_attn_grid_sample(value, shapes, locations, weights), atol=1e-5)


def test_optimizing_twice_changes_nothing_more(tiny_config: Callable[..., DINOConfig]) -> None:
    torch.manual_seed(0)
    model = build_dino(tiny_config()).eval()
    images, mask = torch.randn(1, 3, 96, 128), torch.zeros(1, 96, 128, dtype=torch.bool)
    fast.optimize_for_inference(model, chunk_tokens=16)
    with torch.inference_mode():
        once = model(images, mask)["pred_logits"]
        fast.optimize_for_inference(model, chunk_tokens=16)
        twice = model(images, mask)["pred_logits"]
    assert torch.equal(once, twice)
    assert fast.is_optimized(model)
    assert not any(p.requires_grad for p in model.parameters())
    assert model.backbone[0].body.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_a_negative_chunk_is_refused(tiny_model: nn.Module) -> None:
    with pytest.raises(ValueError, match="chunk_tokens must be >= 0"):
        fast.optimize_for_inference(copy.deepcopy(tiny_model), chunk_tokens=-1)


def test_an_optimized_model_is_neither_saved_nor_loaded_into(
    tmp_path: Path, tiny_config: Callable[..., DINOConfig]
) -> None:
    """Its state_dict is not the official layout (no bn entries, conv biases): refuse instead of writing a
    checkpoint that nothing can load, or loading official weights into folded convolutions."""
    torch.manual_seed(0)
    model = build_dino(tiny_config())
    save_checkpoint(tmp_path / "good.pth", model, tiny_config())
    fast.optimize_for_inference(model)
    with pytest.raises(fast.InferenceOnlyError, match="fresh build_dino"):
        save_checkpoint(tmp_path / "folded.pth", model, tiny_config())
    assert not (tmp_path / "folded.pth").exists()
    with pytest.raises(fast.InferenceOnlyError, match="rearranged for inference"):
        load_checkpoint(model, tmp_path / "good.pth")


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(
    platform.machine() not in {"x86_64", "AMD64"} or not Path("/proc/cpuinfo").is_file(), reason="x86 Linux flags"
)
def test_bfloat16_counts_as_native_only_where_the_cpu_has_bf16_instructions() -> None:
    """The kernel's CPU flags are the outside fact: avx512_bf16 or amx_bf16 (Linux's names for AVX-512 BF16 and AMX's
    bfloat16 tiles). oneDNN's own test also says yes on AVX-512 cores without them, where bfloat16 is emulated."""
    flags = _cpu_flags()
    hardware = bool({"avx512_bf16", "amx_bf16"} & flags)
    assert fast.cpu_bfloat16_supported() is (hardware and torch.backends.mkldnn.is_available()), sorted(
        f for f in flags if f.startswith(("avx512", "amx"))
    )


def test_bfloat16_support_needs_the_instructions_and_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert fast.cpu_bfloat16_supported() is False  # an AVX-512 core without BF16: oneDNN says yes, emulated
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert fast.cpu_bfloat16_supported() is torch.backends.mkldnn.is_available()

    def broken() -> bool:
        raise RuntimeError("no such op on this build")

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", broken)
    assert fast.cpu_bfloat16_supported() is False


def test_under_bfloat16_autocast_the_chunked_layer_samples_at_float32_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autocast makes the offsets bfloat16; the reference path's ``ref + offset / size`` promotes to float32, and so
    must the fast path's ``pixel reference + offset`` (in bfloat16 a pixel near 13 is off by up to 1/32)."""
    torch.manual_seed(1)
    layer = DeformableEncoderLayer(
        d_model=32, d_ffn=48, dropout=0.0, activation="relu", n_levels=4, n_heads=4, n_points=3
    )
    for param in layer.parameters():
        nn.init.normal_(param, std=0.3)
    layer = layer.eval()
    inputs = tuple(t.float() if torch.is_tensor(t) and t.is_floating_point() else t for t in _encoder_layer_inputs())
    seen: list[torch.dtype] = []
    original = attention.sample_pixels

    def spy(prepared, pixels, weights):
        seen.append(pixels.dtype)
        return original(prepared, pixels, weights)

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        reference = layer(*inputs)
        layer.chunk_tokens = 16
        monkeypatch.setattr(attention, "sample_pixels", spy)
        fast = layer(*inputs)
    assert seen and set(seen) == {torch.float32}
    assert (fast.float() - reference.float()).abs().max() < 0.1
