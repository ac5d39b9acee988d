"""The model as the service sees it: preprocessing identical to evaluation, one batched forward, postprocess.

Tensor contract (from :mod:`dinops.model`): ``model(images, mask)`` takes images float [B,3,H,W] normalised
with the ImageNet mean/std and mask bool [B,H,W] (True = padding); ``postprocess(outputs, target_sizes)``
with target sizes [B,2] as (h, w) of the *original* images returns per image ``scores`` [K], ``labels`` [K]
and ``boxes`` [K,4] xyxy in those original pixels.

Only the ids of :attr:`Detector.class_names` are answered: the postprocess (the official one, unchanged) gets those
logit columns alone, so its top-k ranks only (query, known class) pairs; its labels, column positions, are mapped
back to the ids.

:func:`load_detector` reads files and builds the model; tests construct :class:`Detector` directly with any
module that honours the contract.
"""

from __future__ import annotations

import contextlib
import json
import logging
import runpy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import tv_tensors

from dinops.data.transforms import eval_transforms
from dinops.serve import classes

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """The model cannot be built or loaded; the message says which file and why."""


@dataclass
class Prediction:
    scores: list[float]
    labels: list[int]
    boxes: list[list[float]]  # xyxy in pixels of the original (upright) image


@dataclass
class Detector:
    model: torch.nn.Module
    postprocess: Callable[..., list[dict[str, torch.Tensor]]]
    pad_images: Callable[[list[torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]
    class_names: classes.ClassNames = field(default_factory=classes.coco)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: str = "fp32"
    min_size: int = 800
    max_size: int = 1333
    num_select: int = 300
    info: dict[str, Any] = field(default_factory=dict)  # checkpoint, backend, config: reported by /readyz

    def __post_init__(self) -> None:
        self.model.eval().to(self.device)
        self._pipeline = eval_transforms(self.min_size, self.max_size)
        self._known = torch.tensor(self.class_names.ids, device=self.device)

    @staticmethod
    def prepare(image: Image.Image) -> np.ndarray:
        """RGB PIL image -> HWC uint8 array. Runs in the request threads, so it uses no torch op: torch's
        intra-op thread pools, one per calling thread, would oversubscribe the CPU (measured: 100x slower)."""
        return np.array(image, dtype=np.uint8)  # a writable copy, as torch.from_numpy wants

    def preprocess(self, pixels: np.ndarray) -> torch.Tensor:
        """HWC uint8 -> normalised float [3,h,w] on the model's device, resized exactly as evaluation does
        (the same transform objects, applied on the device)."""
        image = torch.from_numpy(pixels).permute(2, 0, 1).to(self.device, non_blocking=True).contiguous()
        resized = self._pipeline.geometric(tv_tensors.Image(image))
        return self._pipeline.finish.image(resized).as_subclass(torch.Tensor)

    def _autocast(self):
        if self.precision in {"bf16", "fp16"}:  # load_detector allows fp16 on a GPU and bf16 where it is native
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            return torch.autocast(self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    @torch.inference_mode()
    def forward(self, images: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]]) -> list[Prediction]:
        """Preprocess and run a batch of :meth:`prepare` d images; ``sizes`` are their (h, w), in which boxes
        are returned."""
        batch, mask = self.pad_images([self.preprocess(image) for image in images])
        with self._autocast():
            outputs = self.model(batch, mask)
        logits = outputs["pred_logits"].index_select(-1, self._known)  # [B, Q, known classes]
        num_select = min(self.num_select, logits.shape[1] * logits.shape[2])
        target_sizes = torch.tensor(sizes, dtype=torch.float32, device=logits.device)
        outputs = {**outputs, "pred_logits": logits}
        outputs = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in outputs.items()}
        results = self.postprocess(outputs, target_sizes, num_select=num_select)
        predictions = []
        for result, (h, w) in zip(results, sizes, strict=True):
            boxes = result["boxes"].float().cpu()
            boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
            boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
            labels = self._known[result["labels"]].cpu().tolist()
            predictions.append(Prediction(result["scores"].float().cpu().tolist(), labels, boxes.tolist()))
        return predictions

    def warm_up(self) -> float:
        """One forward pass on a blank image of a typical size; returns its duration in seconds."""
        start = time.perf_counter()
        self.forward([self.prepare(Image.new("RGB", (640, 480), (114, 114, 114)))], [(480, 640)])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start


# Largest AP loss (AP@[.5:.95], absolute) that lets `auto` choose bfloat16 on a CPU that computes it natively (issue
# 28). Measured on the learning proof's trained model, fast path, 64 validation images: -0.0017 (docs/model.md).
AUTO_BF16_MAX_AP_LOSS = 0.005


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision ``auto`` stands for on ``device``: bf16 on a CPU with native bfloat16 (its AP cost on a trained
    model is within AUTO_BF16_MAX_AP_LOSS, and it is the faster mode there), fp32 elsewhere: on CPUs that would
    emulate bfloat16 (~100x slower) and on GPUs, where fp32 (with the fused kernel) is the measured reference until a
    GPU figure says otherwise. Any other value is returned as it is."""
    from dinops.model.inference import cpu_bfloat16_supported

    if precision != "auto":
        return precision
    return "bf16" if device.type == "cpu" and cpu_bfloat16_supported() else "fp32"


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision the device cannot run well: fp16 on a CPU, bf16 on a CPU without native bfloat16 (there it
    is emulated and runs ~100x slower than fp32: measured 1.1 against 177 GFLOP/s on the AVX2 build machine)."""
    from dinops.model.inference import cpu_bfloat16_supported

    if device.type != "cpu" or precision == "fp32":
        return
    if precision == "fp16":
        raise ModelLoadError("DINO_PRECISION=fp16 runs on a GPU only; on a CPU use fp32 or bf16 (where the CPU has it)")
    if precision == "bf16" and not cpu_bfloat16_supported():
        raise ModelLoadError(
            "DINO_PRECISION=bf16 on a CPU needs native bfloat16 (AVX-512 BF16 or AMX; oneDNN says this CPU has "
            "neither), emulated it would be ~100x slower than fp32: use DINO_PRECISION=fp32"
        )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {name!r} was requested but no CUDA GPU is visible to this process")
    return device


def read_config(path: str) -> dict[str, Any]:
    """A JSON object, or an official DINO ``.py`` config (plain assignments) taken as its globals."""
    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"model config {path} does not exist")
    if file.suffix == ".py":
        values = runpy.run_path(str(file))
        return {k: v for k, v in values.items() if not k.startswith("_") and not callable(v)}
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"model config {path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelLoadError(f"model config {path} must hold a JSON object")
    return value


def backend_name() -> str:
    from dinops import model as dino_model

    probe = getattr(dino_model, "deformable_attention_backend", None)
    return str(probe()) if callable(probe) else "pytorch"


def training_position(checkpoint: dict[str, Any]) -> dict[str, int]:
    """Where a `dinops train` checkpoint stood: ``epoch`` (epochs completed, the index of the epoch in progress),
    ``step`` (optimizer steps done in it) and ``global_step``; empty for other checkpoints."""
    position = checkpoint.get("next")
    if not isinstance(position, dict):
        return {}
    return {
        "epoch": int(position["epoch"]),
        "step": int(position["step"]),
        "global_step": int(checkpoint.get("global_step", 0)),
    }


def load_detector(config: dict[str, Any]) -> Detector:
    """Build the model from ``config`` (the app's settings, keys as in :mod:`dinops.serve.settings`)."""
    from dinops import model as dino_model
    from dinops.model.checkpoint import checkpoint_config, read_checkpoint
    from dinops.model.inference import is_optimized, optimize_for_inference

    path = config["CHECKPOINT"]
    if not path:
        raise ModelLoadError("no checkpoint given: set DINO_CHECKPOINT (or --checkpoint) to a .pth file")
    if not Path(path).is_file():
        raise ModelLoadError(f"checkpoint {path} does not exist (DINO_CHECKPOINT)")
    try:
        checkpoint = read_checkpoint(path)
    except Exception as exc:
        raise ModelLoadError(f"checkpoint {path} cannot be used: {exc}") from exc
    try:
        if config["CONFIG"]:
            cfg = dino_model.DINOConfig.from_official(read_config(config["CONFIG"]))
        else:
            cfg = checkpoint_config(checkpoint)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the model configuration for {path}: {exc}") from exc
    if cfg is None:
        raise ModelLoadError(f"checkpoint {path} carries no model configuration; give it with DINO_CONFIG")
    device = resolve_device(config["DEVICE"])
    precision = resolve_precision(config["PRECISION"], device)
    check_precision(precision, device)
    try:
        model = dino_model.build_dino(cfg)
        dino_model.load_checkpoint(model, path, checkpoint=checkpoint)
    except Exception as exc:
        raise ModelLoadError(f"cannot build the model from {path}: {exc}") from exc
    if config.get("FAST_PATH", True):
        optimize_for_inference(model)
    try:
        names = classes.check(
            classes.resolve(config["CLASS_NAMES"], checkpoint, cfg.num_classes), cfg.num_classes, path
        )
    except classes.ClassNamesError as exc:
        raise ModelLoadError(str(exc)) from exc
    info = {
        "checkpoint": str(path),
        "backend": backend_name(),
        "num_classes": getattr(cfg, "num_classes", None),
        "num_queries": getattr(cfg, "num_queries", None),
        "backbone": getattr(cfg, "backbone", None),
        "class_names": names.source,
        "inference_path": "fast" if is_optimized(model) else "reference",
        **training_position(checkpoint),
    }
    del checkpoint
    return Detector(
        model=model,
        postprocess=dino_model.postprocess,
        pad_images=dino_model.pad_images,
        class_names=names,
        device=device,
        precision=precision,
        min_size=config["MIN_SIZE"],
        max_size=config["MAX_SIZE"],
        num_select=config["NUM_SELECT"],
        info=info,
    )
