"""postprocess: top-k over query x class, labels and queries from the flat index, pixel boxes, optional NMS."""

from __future__ import annotations

import pytest
import torch

from dinops.model import postprocess


def test_scaling_order_and_labels() -> None:
    logits = torch.full((2, 3, 4), -10.0)
    logits[0, 2, 1] = 3.0
    logits[0, 0, 3] = 1.0
    logits[1, 1, 0] = 2.0
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1], [0.25, 0.75, 0.5, 0.5]]]).repeat(2, 1, 1)
    sizes = torch.tensor([[100, 200], [50, 40]])  # (h, w)
    results = postprocess({"pred_logits": logits, "pred_boxes": boxes}, sizes, num_select=2)
    first, second = results
    assert first["labels"].tolist() == [1, 3]
    assert first["scores"].tolist() == pytest.approx(
        [torch.sigmoid(torch.tensor(3.0)).item(), torch.sigmoid(torch.tensor(1.0)).item()]
    )
    torch.testing.assert_close(first["boxes"], torch.tensor([[0.0, 50.0, 100.0, 100.0], [80.0, 40.0, 120.0, 60.0]]))
    assert second["labels"][0].item() == 0
    torch.testing.assert_close(second["boxes"][0], torch.tensor([2.0, 2.5, 6.0, 7.5]))


def test_num_select_is_capped_and_sizes_checked() -> None:
    outputs = {"pred_logits": torch.randn(1, 2, 3), "pred_boxes": torch.rand(1, 2, 4)}
    assert len(postprocess(outputs, torch.tensor([[10, 10]]), num_select=300)[0]["scores"]) == 6
    with pytest.raises(ValueError, match="target_sizes"):
        postprocess(outputs, torch.tensor([10, 10]))


def test_nms_drops_duplicates() -> None:
    logits = torch.tensor([[[4.0], [3.0], [2.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.4, 0.4], [0.51, 0.5, 0.4, 0.4], [0.1, 0.1, 0.1, 0.1]]])
    outputs = {"pred_logits": logits, "pred_boxes": boxes}
    kept = postprocess(outputs, torch.tensor([[100, 100]]), num_select=3, nms_iou_threshold=0.5)[0]
    assert len(kept["scores"]) == 2
    assert kept["scores"][0] == pytest.approx(torch.sigmoid(torch.tensor(4.0)).item())
    assert len(postprocess(outputs, torch.tensor([[100, 100]]), num_select=3)[0]["scores"]) == 3
