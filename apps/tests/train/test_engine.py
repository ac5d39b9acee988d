from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dinops.train.engine import Hooks, StepState, train_one_epoch


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, images, mask, targets=None):
        return {"pred": (self.w * images.mean()).sum()}


class Criterion(torch.nn.Module):
    weight_dict = {"loss_ce": 1.0}

    def __init__(self, blow_up_at: int) -> None:
        super().__init__()
        self.calls, self.blow_up_at = 0, blow_up_at

    def forward(self, outputs, targets):
        self.calls += 1
        loss = outputs["pred"] ** 2
        return {
            "loss_ce": loss * float("nan") if self.calls == self.blow_up_at else loss,
            "class_error": torch.tensor(0.0),
        }


def _run(criterion, max_steps=0, stop_after=None, model=None):
    model = model or Linear()
    batches = [
        (
            torch.full((1, 3, 2, 2), float(i + 1)),
            torch.zeros(1, 2, 2, dtype=torch.bool),
            [{"labels": torch.tensor([1])}],
        )
        for i in range(4)
    ]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    args = SimpleNamespace(
        accum_steps=1,
        amp="none",
        clip_max_norm=0.0,
        print_freq=0,
        max_steps=max_steps,
        checkpoint_steps=0,
        channels_last=True,  # a GPU setting: contiguous on this CPU
    )
    saved = []
    state = StepState()
    hooks = Hooks(
        should_stop=lambda: stop_after is not None and state.step >= stop_after,
        save_latest=lambda s: saved.append(s.step),
    )
    stats, reason = train_one_epoch(
        model, criterion, batches, optimizer, scheduler, scaler, torch.device("cpu"), state, args, 4, hooks
    )
    return model, state, reason, saved, stats


def test_non_finite_loss_stops_before_the_optimizer_step():
    model = Linear()
    with pytest.raises(FloatingPointError, match="loss is nan at epoch 0 step 2"):
        _run(Criterion(blow_up_at=3), model=model)
    after_two_steps = model.w.item()
    assert after_two_steps < 1.0  # two good steps moved it; the third, non-finite one did not (w would be nan)


def test_stop_request_and_max_steps_checkpoint_mid_epoch():
    _, state, reason, saved, _ = _run(Criterion(blow_up_at=-1), stop_after=2)
    assert reason == "signal" and state.step == 2 and saved == [2]
    _, state, reason, saved, stats = _run(Criterion(blow_up_at=-1), max_steps=3)
    assert reason == "max_steps" and state.global_step == 3 and saved == [3]
    assert {"loss", "loss_ce", "loss_ce_unscaled", "class_error", "lr"} <= stats.keys()
    _, state, reason, saved, _ = _run(Criterion(blow_up_at=-1))
    assert reason == "epoch_end" and state.step == 4 and saved == []
