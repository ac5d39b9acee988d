"""pad_images: top-left placement, per-dimension maximum, mask True = padding."""

from __future__ import annotations

import pytest
import torch

from dinops.model import pad_images


def test_pad_images_layout() -> None:
    a = torch.full((3, 4, 6), 1.0)
    b = torch.full((3, 5, 3), 2.0)
    images, mask = pad_images([a, b])
    assert images.shape == (2, 3, 5, 6)
    assert mask.shape == (2, 5, 6)
    assert torch.equal(images[0, :, :4, :6], a)
    assert float(images[0, :, 4:].abs().sum()) == 0.0
    assert torch.equal(images[1, :, :5, :3], b)
    assert float(images[1, :, :, 3:].abs().sum()) == 0.0
    assert int((~mask[0]).sum()) == 24
    assert not mask[0, :4, :6].any() and mask[0, 4:].all()
    assert not mask[1, :5, :3].any() and mask[1, :, 3:].all()


def test_pad_images_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        pad_images([])
    with pytest.raises(ValueError, match=r"\[C, H, W\]"):
        pad_images([torch.zeros(1, 3, 4, 4)])
    with pytest.raises(ValueError, match="channels"):
        pad_images([torch.zeros(3, 4, 4), torch.zeros(1, 4, 4)])
