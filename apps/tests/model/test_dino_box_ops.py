"""Box operations: round trips, known values, pairwise == elementwise."""

from __future__ import annotations

import math

import pytest
import torch

from dinops.model.box_ops import (
    box_cxcywh_to_xyxy,
    box_iou,
    box_xyxy_to_cxcywh,
    elementwise_generalized_box_iou,
    generalized_box_iou,
    inverse_sigmoid,
    scale_boxes,
)


def test_format_round_trips(random_cxcywh) -> None:
    boxes = random_cxcywh(50)
    torch.testing.assert_close(box_xyxy_to_cxcywh(box_cxcywh_to_xyxy(boxes)), boxes)
    xyxy = box_cxcywh_to_xyxy(boxes)
    torch.testing.assert_close(box_cxcywh_to_xyxy(box_xyxy_to_cxcywh(xyxy)), xyxy)


def test_known_values() -> None:
    assert box_cxcywh_to_xyxy(torch.tensor([0.5, 0.5, 0.2, 0.4])).tolist() == pytest.approx([0.4, 0.3, 0.6, 0.7])
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    b = torch.tensor([[1.0, 1.0, 3.0, 3.0], [4.0, 0.0, 5.0, 1.0]])
    iou, union = box_iou(a, b)
    assert iou[0].tolist() == pytest.approx([1 / 7, 0.0])
    assert union[0].tolist() == pytest.approx([7.0, 5.0])
    # GIoU of the disjoint pair: 0 - (enclosing 10 - union 5) / 10.
    assert generalized_box_iou(a, b)[0].tolist() == pytest.approx([1 / 7 - 2 / 9, -0.5])
    assert generalized_box_iou(a, a)[0].tolist() == pytest.approx([1.0])


def test_elementwise_giou_equals_pairwise_diagonal(random_cxcywh) -> None:
    a = box_cxcywh_to_xyxy(random_cxcywh(30, seed=1))
    b = box_cxcywh_to_xyxy(random_cxcywh(30, seed=2))
    assert torch.equal(elementwise_generalized_box_iou(a, b), torch.diag(generalized_box_iou(a, b)))


def test_degenerate_boxes_are_rejected() -> None:
    bad = torch.tensor([[0.5, 0.5, 0.4, 0.6]])
    with pytest.raises(ValueError, match="degenerate"):
        generalized_box_iou(bad, bad)
    with pytest.raises(ValueError, match="equal shapes"):
        elementwise_generalized_box_iou(bad, torch.zeros(2, 4))


def test_inverse_sigmoid_clamps_like_official() -> None:
    x = torch.tensor([-0.5, 0.0, 0.0005, 0.25, 0.5, 0.9995, 1.0, 2.0])
    got = inverse_sigmoid(x)
    # x and 1 - x are each clamped to >= 1e-3: at x = 0 the result is log(1e-3 / 1), at 0.0005 log(1e-3 / 0.9995).
    assert float(got[0]) == float(got[1]) == pytest.approx(math.log(1e-3))
    assert float(got[2]) == pytest.approx(math.log(1e-3 / 0.9995))
    assert float(got[6]) == float(got[7]) == pytest.approx(-math.log(1e-3))
    assert got[4] == 0.0
    torch.testing.assert_close(inverse_sigmoid(torch.tensor([0.25, 0.75])).sigmoid(), torch.tensor([0.25, 0.75]))


def test_scale_boxes_to_pixels() -> None:
    boxes = torch.tensor([[[0.5, 0.5, 1.0, 1.0], [0.25, 0.5, 0.5, 0.2]]])
    sizes = torch.tensor([[100, 200]])  # (h, w)
    expected = torch.tensor([[[0.0, 0.0, 200.0, 100.0], [0.0, 40.0, 100.0, 60.0]]])
    torch.testing.assert_close(scale_boxes(boxes, sizes), expected)
