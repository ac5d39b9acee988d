"""How the service runs the model: the fast path, the precision a CPU allows, and torch's threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dinops.serve import threads
from dinops.serve.app import settings_config
from dinops.serve.detector import ModelLoadError, load_detector, resolve_precision
from dinops.serve.testing import write_small_checkpoint

ENV = {"DINO_MIN_SIZE": "96", "DINO_MAX_SIZE": "128", "DINO_DEVICE": "cpu"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_checkpoint(tmp_path_factory.mktemp("model") / "small.pth", seed=2)


def _detector(checkpoint: Path, **env: str):
    return load_detector(settings_config({**ENV, **env, "DINO_CHECKPOINT": str(checkpoint)}))


def _image() -> np.ndarray:
    """A noise image (PIL's effect_noise draws new noise on every call)."""
    return np.asarray(Image.effect_noise((120, 90), 50).convert("RGB")).copy()


def test_the_fast_path_is_the_default_and_answers_as_the_reference_path(checkpoint: Path) -> None:
    fast, reference = _detector(checkpoint), _detector(checkpoint, DINO_FAST_PATH="false")
    assert fast.info["inference_path"] == "fast" and reference.info["inference_path"] == "reference"
    image = _image()
    got = fast.forward([image], [(90, 120)])[0]
    expected = reference.forward([image], [(90, 120)])[0]
    assert sorted(got.scores, reverse=True)[:50] == pytest.approx(sorted(expected.scores, reverse=True)[:50], abs=1e-4)


def test_fp16_on_a_cpu_is_refused(checkpoint: Path) -> None:
    with pytest.raises(ModelLoadError, match="fp16 runs on a GPU only"):
        _detector(checkpoint, DINO_PRECISION="fp16")


def test_bf16_on_a_cpu_without_native_bfloat16_is_refused(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dinops.model.inference.cpu_bfloat16_supported", lambda: False)
    with pytest.raises(ModelLoadError, match="needs native bfloat16"):
        _detector(checkpoint, DINO_PRECISION="bf16")


def test_bf16_on_a_cpu_with_native_bfloat16_runs_under_autocast(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pretend the CPU has it (this one is emulated: slow, same numbers) and check the forward runs in bfloat16."""
    monkeypatch.setattr("dinops.model.inference.cpu_bfloat16_supported", lambda: True)
    detector = _detector(checkpoint, DINO_PRECISION="bf16")
    seen: list[torch.dtype] = []
    handle = detector.model.transformer.encoder.layers[0].linear2.register_forward_hook(
        lambda _m, _i, out: seen.append(out.dtype)
    )
    prediction = detector.forward([_image()], [(90, 120)])[0]
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert prediction.scores and all(0.0 <= s <= 1.0 for s in prediction.scores)


def _forward_dtypes(detector) -> set[torch.dtype]:
    seen: list[torch.dtype] = []
    handle = detector.model.transformer.encoder.layers[0].linear2.register_forward_hook(
        lambda _m, _i, out: seen.append(out.dtype)
    )
    detector.forward([_image()], [(90, 120)])
    handle.remove()
    return set(seen)


def test_by_default_a_cpu_that_would_emulate_bfloat16_runs_fp32(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dinops.model.inference.cpu_bfloat16_supported", lambda: False)
    detector = _detector(checkpoint)
    assert detector.precision == "fp32"
    assert _forward_dtypes(detector) == {torch.float32}


def test_by_default_a_cpu_with_native_bfloat16_runs_bf16(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DINO_PRECISION=auto (the default) takes bfloat16 where the CPU computes it natively: its AP cost on the
    learning proof's trained model is -0.0017, within the 0.005 the choice allows (docs/model.md)."""
    monkeypatch.setattr("dinops.model.inference.cpu_bfloat16_supported", lambda: True)
    detector = _detector(checkpoint)
    assert detector.precision == "bf16"
    assert _forward_dtypes(detector) == {torch.bfloat16}
    assert _detector(checkpoint, DINO_PRECISION="fp32").precision == "fp32"


def test_auto_is_fp32_on_a_gpu_and_leaves_an_explicit_choice_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dinops.model.inference.cpu_bfloat16_supported", lambda: True)
    assert resolve_precision("auto", torch.device("cuda", 0)) == "fp32"
    assert resolve_precision("auto", torch.device("cpu")) == "bf16"
    for explicit in ("fp32", "bf16", "fp16"):
        assert resolve_precision(explicit, torch.device("cpu")) == explicit


def test_an_unknown_precision_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="auto"):
        settings_config({**ENV, "DINO_PRECISION": "int8"})


def _cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "200000 100000"}, 2.0),
        ({"cpu.max": "150000 100000"}, 1.5),
        ({"cpu.max": "max 100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000"}, 0.5),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, None),
        ({"cpu.max": "garbage"}, None),
        ({}, None),
    ],
    ids=["v2-2", "v2-1.5", "v2-unlimited", "v1-0.5", "v1-unlimited", "v2-unreadable", "none"],
)
def test_the_cgroup_cpu_limit_is_read_from_v2_and_v1(
    tmp_path: Path, files: dict[str, str], limit: float | None
) -> None:
    assert threads.cgroup_cpu_limit(_cgroup(tmp_path, files)) == limit


def test_torch_threads_follow_the_limit_rounded_up_and_never_exceed_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: 16)
    assert threads.torch_threads(0, _cgroup(tmp_path / "a", {"cpu.max": "150000 100000"}))[0] == 2
    assert threads.torch_threads(0, _cgroup(tmp_path / "b", {"cpu.max": "3200000 100000"}))[0] == 16
    assert threads.torch_threads(0, _cgroup(tmp_path / "c", {"cpu.max": "10000 100000"}))[0] == 1
    assert threads.torch_threads(0, _cgroup(tmp_path / "d", {"cpu.max": "max 100000"})) == (
        16,
        "16 usable cores, no CPU limit",
    )
    assert threads.torch_threads(3, tmp_path / "c") == (3, "DINO_TORCH_THREADS")
    with pytest.raises(ValueError, match="0 \\(the CPU limit\\) or a positive number"):
        threads.torch_threads(-1)


def test_a_negative_thread_count_is_refused_as_a_setting() -> None:
    with pytest.raises(Exception, match="DINO_TORCH_THREADS|torch.threads|negative"):
        settings_config({"DINO_TORCH_THREADS": "-2"})
