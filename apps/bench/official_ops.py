"""The official DINO's training step with its compiled CUDA op, for gpu_bench.py's ratio.

The op is compiled on the machine with ``torch.utils.cpp_extension.load`` from a copy of the checkout's
``models/dino/ops/src`` (``vision.cpp``, ``cpu/ms_deform_attn_cpu.cpp``, ``cuda/ms_deform_attn_cuda.cu``; two calls
respelled for current PyTorch, :data:`API_PORT`) with the flags of the official ``setup.py`` as its recorded build
shows them (``-DWITH_CUDA``; for nvcc ``-DCUDA_HAS_FP16=1`` and the ``__CUDA_NO_HALF*`` defines). The model is built
by ``official_dino.build_official`` (stand-ins for timm and the ImageNet download), then its op module gets the
compiled functions back. The step is the official training loop's: forward with targets (denoising queries), the
official criterion's weighted losses, backward, clip 0.1, AdamW; fp32, no TF32, batch 2, the batch of bench_train.py.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch

# PyTorch's dispatch macros take a ScalarType; ``Tensor::type()`` (DeprecatedTypeProperties) stopped converting to one
# (nvcc: 'no suitable conversion function from "const at::DeprecatedTypeProperties" to "c10::ScalarType"' at
# ms_deform_attn_cuda.cu(64) and (134) with torch 2.14.1 here; the same fix upstream for the same sources:
# IDEA-Research/GroundingDINO pull 462). The non-deprecated spellings of the same calls; no arithmetic changes.
API_PORT = {".type().is_cuda()": ".is_cuda()", "(value.type(), ": "(value.scalar_type(), "}


def ported_sources(src: Path, into: Path) -> Path:
    """A copy of the checkout's ``models/dino/ops/src`` in ``into`` with :data:`API_PORT` applied; the copy's root."""
    ops = src / "models" / "dino" / "ops" / "src"
    shutil.copytree(ops, into / "src")
    for path in (into / "src").rglob("*"):
        if path.suffix in (".h", ".cpp", ".cu", ".cuh"):
            text = original = path.read_text()
            for old, new in API_PORT.items():
                text = text.replace(old, new)
            if text != original:
                path.write_text(text)
    return into / "src"


def compile_official_op(src: Path):
    """The official ``MultiScaleDeformableAttention`` extension compiled here (minutes; in a temp folder), from
    :func:`ported_sources`."""
    from torch.utils.cpp_extension import load

    build = Path(tempfile.mkdtemp(prefix="dino-msda-"))
    ops = ported_sources(src, build)
    no_half = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
    return load(
        name="MultiScaleDeformableAttention",
        sources=[
            str(ops / "vision.cpp"),
            str(ops / "cpu" / "ms_deform_attn_cpu.cpp"),
            str(ops / "cuda" / "ms_deform_attn_cuda.cu"),
        ],
        extra_include_paths=[str(ops)],
        extra_cflags=["-DWITH_CUDA"],
        extra_cuda_cflags=["-DWITH_CUDA", "-DCUDA_HAS_FP16=1", *no_half],
        build_directory=str(build),
        verbose=False,
    )


def official_ratios(official: dict, ours: dict) -> dict:
    """``ratio_<variant>``: our images/s over the official fp32 step's, for each of our training variants measured
    (above 1: faster than the official CUDA op); nothing while either side is missing."""
    if "images_per_s" not in official:
        return {}
    return {
        f"ratio_{label}": round(entry["images_per_s"] / official["images_per_s"], 3)
        for label, entry in ours.items()
        if isinstance(entry, dict) and "images_per_s" in entry
    }


def official_train_time(clock, args: argparse.Namespace, size: tuple[int, int]) -> dict:
    """Images/s and peak memory of the official fp32 training step (:func:`official_ratios` compares)."""
    if not args.official_src:
        return {"skipped": "no --official-src (or DINO_OFFICIAL_SRC) given"}
    if shutil.which("nvcc") is None:
        return {"skipped": "nvcc not found: the official CUDA op cannot be compiled here"}
    if not clock.left(margin_s=90.0):  # compile and 13 steps: 56 s on an H100 with 16 cores (2026-11-27)
        return {"skipped": "time budget"}
    import official_dino
    from bench_train import random_batch

    src = Path(args.official_src)
    try:  # official_dino exits (SystemExit) on a path that is no checkout or a missing ../shared/dino config
        config = official_dino.official_config(4) | {"device": "cuda"}
        if not (src / "models" / "dino" / "dino.py").is_file():
            raise SystemExit(f"{src} is not a checkout of IDEA-Research/DINO")
    except SystemExit as exc:
        return {"skipped": str(exc)}
    try:
        extension = compile_official_op(src)
    except Exception as exc:  # a compiler error of the official sources on this torch: report it, keep our figures
        return {"skipped": f"official CUDA op failed to compile: {str(exc)[-600:]}"}
    sys.modules["MultiScaleDeformableAttention"] = extension
    compiled_forward = extension.ms_deform_attn_forward
    official_dino.build_official(src, config)  # path, stand-ins; its op module is ours until restored below
    extension.ms_deform_attn_forward = compiled_forward
    from models.dino import build_dino  # type: ignore[import-not-found]
    from util.misc import NestedTensor  # type: ignore[import-not-found]

    torch.manual_seed(0)
    model, criterion, _ = build_dino(argparse.Namespace(**config))
    model, criterion = model.to(clock.device).train(), criterion.to(clock.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    images, targets = random_batch(2, *size, 91, torch.Generator().manual_seed(0))
    from dinops.model import pad_images

    padded, mask = (t.to(clock.device) for t in pad_images(images))
    targets = [{k: v.to(clock.device) for k, v in t.items()} for t in targets]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def step():
        losses = criterion(model(NestedTensor(padded, mask), targets), targets)
        loss = sum(losses[k] * criterion.weight_dict[k] for k in losses if k in criterion.weight_dict)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats(clock.device)
    seconds = clock.time(step, args.warmup, args.iters)
    return {
        "images_per_s": round(2 / seconds, 2),
        "peak_gib": round(torch.cuda.max_memory_allocated(clock.device) / 2**30, 2),
    }
