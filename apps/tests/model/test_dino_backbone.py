"""Backbone: torchvision names, frozen parts, local ImageNet weights (never downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

from dinops.model.backbone import Backbone


def test_local_imagenet_weights_are_loaded(tmp_path: Path) -> None:
    torch.manual_seed(3)
    reference = torchvision.models.resnet18(weights=None)
    path = tmp_path / "resnet18-imagenet.pth"
    torch.save(reference.state_dict(), path)  # torchvision's format, fc included
    backbone = Backbone(name="resnet18", return_interm_indices=[1, 2, 3], weights_path=path)
    assert torch.equal(backbone.body.layer3[1].conv2.weight, reference.layer3[1].conv2.weight)
    assert torch.equal(backbone.body.bn1.running_var, reference.bn1.running_var)
    assert not hasattr(backbone.body, "fc")


def test_bad_weight_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        Backbone(name="resnet18", return_interm_indices=[3], weights_path=tmp_path / "missing.pth")
    state = torchvision.models.resnet18(weights=None).state_dict()
    path = tmp_path / "wrong-shape.pth"
    torch.save({**state, "conv1.weight": torch.zeros(64, 3, 3, 3)}, path)
    with pytest.raises(ValueError, match="conv1.weight has shape"):
        Backbone(name="resnet18", return_interm_indices=[3], weights_path=path)
    path = tmp_path / "incomplete.pth"
    torch.save({k: v for k, v in state.items() if not k.startswith("layer4")}, path)
    with pytest.raises(ValueError, match="not a torchvision ResNet"):
        Backbone(name="resnet18", return_interm_indices=[3], weights_path=path)


def test_outputs_channels_and_freezing() -> None:
    backbone = Backbone(name="resnet18", return_interm_indices=[0, 1, 2, 3])
    features = backbone(torch.randn(1, 3, 64, 96))
    assert [tuple(f.shape[1:]) for f in features] == [(64, 16, 24), (128, 8, 12), (256, 4, 6), (512, 2, 3)]
    assert backbone.num_channels == [64, 128, 256, 512]
    trainable = {name.split(".")[1] for name, p in backbone.named_parameters() if p.requires_grad}
    assert trainable == {"layer2", "layer3", "layer4"}
    frozen = Backbone(name="resnet18", return_interm_indices=[3], train_backbone=False)
    assert not any(p.requires_grad for p in frozen.parameters())
    assert not any("num_batches_tracked" in k for k in backbone.state_dict())
