"""Shared fixtures: the official reference data (skipped when absent), one small model per session, tiny configs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from dinops.model import DINOConfig, build_dino

REPO_ROOT = Path(__file__).resolve().parents[3]


def reference_root() -> Path:
    """``$DINOPS_SHARED_DIR/dino``, by default ``<repo>/../shared/dino`` (CI has it beside the clone)."""
    return Path(os.environ.get("DINOPS_SHARED_DIR", REPO_ROOT.parent / "shared")) / "dino"


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and CI's two cores are shared with other test processes."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    root = reference_root()
    if not (root / "small" / "state_dict.pt").is_file():
        pytest.skip(f"official DINO reference data not found at {root} (set DINOPS_SHARED_DIR to the shared/ folder)")
    return root


@pytest.fixture(scope="session")
def small_dir(reference_dir: Path) -> Path:
    return reference_dir / "small"


@pytest.fixture(scope="session")
def small_args(small_dir: Path) -> dict[str, Any]:
    return json.loads((small_dir / "config.json").read_text())


@pytest.fixture(scope="session")
def small_state_dict(small_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(small_dir / "state_dict.pt", weights_only=True)


@pytest.fixture(scope="session")
def small_inputs(small_dir: Path) -> dict[str, Any]:
    return torch.load(small_dir / "inputs.pt", weights_only=True)


@pytest.fixture(scope="session")
def small_targets(small_dir: Path) -> list[dict[str, torch.Tensor]]:
    return torch.load(small_dir / "targets.pt", weights_only=True)["targets"]


@pytest.fixture(scope="session")
def small_model(small_args: dict[str, Any], small_state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The reference small model in train mode (deterministic: dropout 0, frozen BN), DN on as configured."""
    model = build_dino(DINOConfig.from_official(small_args))
    model.load_state_dict(small_state_dict, strict=True)
    return model


@pytest.fixture(scope="session")
def small_eval_outputs(small_model: torch.nn.Module, small_inputs: dict[str, Any]) -> dict[str, Any]:
    """Eval-mode forward of the small model on the reference inputs, with intermediates."""
    small_model.eval()
    with torch.no_grad():
        out = small_model(small_inputs["padded"], small_inputs["mask"], return_intermediates=True)
    small_model.train()
    return out


def _tiny_config(**changes: Any) -> DINOConfig:
    """A detector that runs in well under a second on CPU: resnet18, hidden 64, 1+2 layers, 12 queries."""
    base = DINOConfig(
        backbone="resnet18",
        hidden_dim=64,
        nheads=4,
        dim_feedforward=64,
        enc_layers=1,
        dec_layers=2,
        num_queries=12,
        num_classes=3,
        enc_n_points=2,
        dec_n_points=2,
        dn_number=2,
        dn_labelbook_size=5,
        num_select=20,
    )
    return base.replace(**changes)


def _random_cxcywh(n: int, seed: int = 0) -> torch.Tensor:
    """``[n, 4]`` normalised cxcywh boxes well inside the image."""
    gen = torch.Generator().manual_seed(seed)
    centre = torch.rand(n, 2, generator=gen) * 0.6 + 0.2
    size = torch.rand(n, 2, generator=gen) * 0.3 + 0.05
    return torch.cat([centre, size], dim=1)


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., DINOConfig]:
    """Factory: ``tiny_config(**changes)``."""
    return _tiny_config


@pytest.fixture(scope="session")
def random_cxcywh() -> Callable[..., torch.Tensor]:
    """Factory: ``random_cxcywh(n, seed)``."""
    return _random_cxcywh


@pytest.fixture(scope="session")
def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_dino(_tiny_config()).eval()
