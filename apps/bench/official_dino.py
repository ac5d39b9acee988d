"""Build the official IDEA-Research DINO model from a checkout of its repository, for side-by-side benchmarks.

Nothing of the official code is part of dinops: pass the path of a checkout (``git clone
https://github.com/IDEA-Research/DINO; git -C DINO checkout faa8520``, the commit ../shared/dino/README.md names) with
``--official-src`` or ``DINO_OFFICIAL_SRC``. The official model needs its compiled CUDA op
``MultiScaleDeformableAttention`` even on a CPU; as for the reference data in ../shared/dino, its own pure-PyTorch
function ``ms_deform_attn_core_pytorch`` (``models/dino/ops/functions/ms_deform_attn_func.py``) stands in for it.
Two more stand-ins keep the import from reaching for what a CPU benchmark does not use: ``timm`` (only its ConvNeXt
and Swin backbones import it) and the ImageNet download of the ResNet (``is_main_process`` answers False while the
model is built, as on a non-zero rank; the weights come from our state_dict afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path

import torch

# ../shared/dino beside the checkout, or $DINOPS_SHARED_DIR/dino as the tests read it (bench_precision.py too)
SHARED_DINO = Path(os.environ.get("DINOPS_SHARED_DIR", Path(__file__).resolve().parents[2].parent / "shared")) / "dino"
_CONFIG = SHARED_DINO / "official_4scale_r50_config.json"


def _stand_ins() -> None:
    for name in ("timm", "timm.models", "timm.models.layers"):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.trunc_normal_ = module.DropPath = module.to_2tuple = None
    sys.modules.setdefault("MultiScaleDeformableAttention", types.ModuleType("MultiScaleDeformableAttention"))


def build_official(src: str | Path, config: dict) -> torch.nn.Module:
    """The official ``build_dino(args)`` model (eval mode) from the checkout ``src``, with ``config`` as its args."""
    src = Path(src)
    if not (src / "models" / "dino" / "dino.py").is_file():
        raise SystemExit(f"{src} is not a checkout of IDEA-Research/DINO (no models/dino/dino.py)")
    sys.path.insert(0, str(src))
    _stand_ins()
    from models.dino import backbone, build_dino  # type: ignore[import-not-found]
    from models.dino.ops.functions import ms_deform_attn_func  # type: ignore[import-not-found]

    def forward(value, shapes, _level_start_index, locations, weights, _im2col_step):
        return ms_deform_attn_func.ms_deform_attn_core_pytorch(value, shapes, locations, weights)

    sys.modules["MultiScaleDeformableAttention"].ms_deform_attn_forward = forward
    backbone.is_main_process = lambda: False  # no ImageNet download while building
    model, _criterion, _postprocessors = build_dino(argparse.Namespace(**config))
    return model.eval()


def official_config(num_feature_levels: int = 4) -> dict:
    """The official 4-scale (or 5-scale) R50 args from ``$DINOPS_SHARED_DIR/dino`` (../shared/dino), on the CPU."""
    path = _CONFIG if num_feature_levels == 4 else _CONFIG.with_name("official_5scale_r50_config.json")
    if not path.is_file():
        raise SystemExit(f"{path} is missing: the official configuration comes from ../shared/dino (DINOPS_SHARED_DIR)")
    config = json.loads(path.read_text())
    config["device"] = "cpu"
    return config


def forward(model: torch.nn.Module, images: torch.Tensor, mask: torch.Tensor) -> dict:
    """The official model takes a ``NestedTensor`` (images, mask True = padding)."""
    from util.misc import NestedTensor  # type: ignore[import-not-found]

    return model(NestedTensor(images, mask))
