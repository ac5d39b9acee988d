from __future__ import annotations

import json

from PIL import Image

from dinops.train.analyze import console_losses, main


def _records():
    out = []
    for epoch in range(3):
        out.append(
            {
                "train_lr": 1e-4 if epoch < 2 else 1e-5,
                "train_class_error": 50.0 - 10 * epoch,
                "train_loss": 10.0 / (epoch + 1),
                "train_loss_ce": 1.0 / (epoch + 1),
                "train_loss_bbox": 2.0 / (epoch + 1),
                "train_loss_bbox_0": 9.0,
                "train_loss_bbox_unscaled": 0.4,
                "test_coco_eval_bbox": [0.1 * (epoch + 1), 0.3, 0.1] + [0.0] * 9,
                "epoch": epoch,
                "n_parameters": 123,
            }
        )
    return out


def test_plots_and_summary(tmp_path):
    (tmp_path / "log.txt").write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    (tmp_path / "console.log").write_text(
        "2026-01-01 00:00:00,000 INFO Epoch: [0]  [ 0/10]  eta: 0:00:05  lr: 0.0001  loss: 12.5000 (12.5000)\n"
        "2026-01-01 00:00:01,000 INFO Epoch: [0]  [ 5/10]  eta: 0:00:02  lr: 0.0001  loss: 9.2500 (10.0000)\n"
        "noise line\n"
    )
    assert main([str(tmp_path), "--log-scale"]) == 0
    out = tmp_path / "analysis"
    for name in ("loss.png", "class_error.png", "lr.png", "ap.png"):
        with Image.open(out / name) as image:
            assert image.size == (800, 450)
    summary = (out / "summary.md").read_text()
    assert "best bbox AP: 0.3000 at epoch 2" in summary
    assert "training loss: 10.0000 (epoch 0) -> 3.3333 (epoch 2)" in summary
    assert "| 1 | 5.0000 | 0.2000 | 0.3000 | 0.1000 |" in summary
    assert console_losses(tmp_path / "console.log") == [(0.0, 12.5), (0.5, 9.25)]


def test_missing_or_broken_log_is_a_clear_error(tmp_path, caplog):
    assert main([str(tmp_path)]) == 2
    assert "has no epochs" in caplog.text
    (tmp_path / "log.txt").write_text('{"epoch": 0}\nnot json\n')
    assert main([str(tmp_path)]) == 2
    assert "log.txt:2: not a JSON line" in caplog.text
