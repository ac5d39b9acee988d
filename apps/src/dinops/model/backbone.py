"""ResNet backbone with frozen batch norm, torchvision key names, and its per-level padding masks and positions.

State-dict names are torchvision's under ``backbone.0.body.`` (``conv1``, ``bn1``, ``layer1..4``; no ``fc``), so
official DINO checkpoints and torchvision ImageNet weights both load. Nothing is ever downloaded: ImageNet weights
come from a local file in torchvision's format when one is given.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torchvision.ops.misc import FrozenBatchNorm2d

from dinops.model.position_encoding import PositionEmbeddingSineHW

log = logging.getLogger(__name__)

_CHANNELS = {
    "resnet18": (64, 128, 256, 512),
    "resnet34": (64, 128, 256, 512),
    "resnet50": (256, 512, 1024, 2048),
    "resnet101": (256, 512, 1024, 2048),
}


def resize_mask(mask: Tensor, size: tuple[int, int]) -> Tensor:
    """Full-resolution padding mask ``[B, H, W]`` (True = padding) -> ``[B, h, w]``, nearest, as the official code."""
    return F.interpolate(mask[None].float(), size=size).to(torch.bool)[0]


class ResNetBody(nn.Module):
    """torchvision ResNet stem and stages up to the last returned one; returns the chosen stages' outputs."""

    def __init__(self, *, name: str, dilation: bool, return_interm_indices: list[int]) -> None:
        super().__init__()
        if name not in _CHANNELS:
            raise ValueError(f"unsupported backbone {name!r}; use one of {sorted(_CHANNELS)}")
        net = getattr(torchvision.models, name)(
            weights=None, norm_layer=FrozenBatchNorm2d, replace_stride_with_dilation=[False, False, dilation]
        )
        self.return_interm_indices = list(return_interm_indices)
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        for index in range(max(self.return_interm_indices) + 1):
            self.add_module(f"layer{index + 1}", getattr(net, f"layer{index + 1}"))
        self.num_channels = [_CHANNELS[name][i] for i in self.return_interm_indices]

    def forward(self, images: Tensor) -> list[Tensor]:
        """``[B, 3, H, W]`` -> one ``[B, C_i, H/2^(i+2), W/2^(i+2)]`` map per returned index (dilation: layer4 /16)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        outputs = []
        for index in range(max(self.return_interm_indices) + 1):
            x = getattr(self, f"layer{index + 1}")(x)
            if index in self.return_interm_indices:
                outputs.append(x)
        return outputs


class Backbone(nn.Module):
    """Holds ``body``; freezes the stem and layer1 (everything when ``train_backbone`` is False)."""

    def __init__(
        self,
        *,
        name: str,
        dilation: bool = False,
        return_interm_indices: list[int],
        train_backbone: bool = True,
        weights_path: str | Path | None = None,
    ) -> None:
        super().__init__()
        self.body = ResNetBody(name=name, dilation=dilation, return_interm_indices=return_interm_indices)
        if weights_path is not None:
            load_imagenet_weights(self.body, weights_path)
        for param_name, param in self.body.named_parameters():
            param.requires_grad_(train_backbone and any(f"layer{i}" in param_name for i in (2, 3, 4)))
        self.num_channels = self.body.num_channels

    def forward(self, images: Tensor) -> list[Tensor]:
        """See :meth:`ResNetBody.forward`."""
        return self.body(images)


class BackboneWithPosition(nn.ModuleList):
    """``[backbone, position_encoding]``: a list so that checkpoint keys read ``backbone.0.body.*`` as officially."""

    def __init__(self, backbone: Backbone, position_encoding: PositionEmbeddingSineHW) -> None:
        super().__init__([backbone, position_encoding])
        self.num_channels = backbone.num_channels

    def forward(self, images: Tensor, mask: Tensor) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """images ``[B, 3, H, W]``, mask ``[B, H, W]`` (True = padding) -> per level (features, masks, positions)."""
        features = self[0](images)
        masks = [resize_mask(mask, tuple(f.shape[-2:])) for f in features]
        positions = [self[1](m).to(f.dtype) for f, m in zip(features, masks, strict=True)]
        return features, masks, positions


def load_imagenet_weights(body: ResNetBody, path: str | Path) -> None:
    """Load a torchvision-format ResNet state_dict from a local file (``fc.*`` and later stages are ignored)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"backbone weights file {path} does not exist (nothing is downloaded)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    wanted = body.state_dict()
    usable = {k: v for k, v in state.items() if k in wanted}
    missing = sorted(set(wanted) - set(usable))
    if missing:
        raise ValueError(f"{path} is not a torchvision ResNet state_dict for this backbone; missing {missing[:5]}...")
    for key, tensor in usable.items():
        if tensor.shape != wanted[key].shape:
            raise ValueError(f"{path}: {key} has shape {tuple(tensor.shape)}, expected {tuple(wanted[key].shape)}")
    body.load_state_dict(usable, strict=True)
    log.info("loaded backbone ImageNet weights from %s", path)
