"""Smoothed metrics and console lines with ETA, in the shape of torchvision's detection references."""

from __future__ import annotations

import datetime
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

log = logging.getLogger("dinops.train")


class SmoothedValue:
    """The median over a window and the average over everything seen."""

    def __init__(self, window: int = 20, fmt: str = "{median:.4f} ({global_avg:.4f})") -> None:
        self.window: deque[float] = deque(maxlen=window)
        self.total, self.count, self.fmt = 0.0, 0, fmt

    def update(self, value: float, n: int = 1) -> None:
        self.window.append(value)
        self.count += n
        self.total += value * n

    @property
    def median(self) -> float:
        ordered = sorted(self.window)
        return ordered[len(ordered) // 2] if ordered else 0.0

    @property
    def global_avg(self) -> float:
        return self.total / max(self.count, 1)

    @property
    def value(self) -> float:
        return self.window[-1] if self.window else 0.0

    def __str__(self) -> str:
        return self.fmt.format(median=self.median, global_avg=self.global_avg, value=self.value)


class MetricLogger:
    def __init__(self, delimiter: str = "  ", shown: tuple[str, ...] | None = None) -> None:
        self.meters: dict[str, SmoothedValue] = {}
        self.delimiter = delimiter
        self.shown = shown  # meters on the console line; None = all

    def add_meter(self, name: str, meter: SmoothedValue) -> None:
        self.meters[name] = meter

    def update(self, **values: float) -> None:
        for name, value in values.items():
            self.meters.setdefault(name, SmoothedValue()).update(float(value))

    def global_averages(self) -> dict[str, float]:
        return {name: meter.global_avg for name, meter in self.meters.items()}

    def __str__(self) -> str:
        return self.delimiter.join(
            f"{name}: {meter}" for name, meter in self.meters.items() if self.shown is None or name in self.shown
        )

    def log_every(
        self, iterable: Iterable[Any], total: int, print_freq: int, header: str, start: int = 0
    ) -> Iterator[Any]:
        """Yield from ``iterable`` (items ``start..total-1`` of an epoch); a line with ETA every ``print_freq``."""
        width = len(str(total))
        began = last = time.time()
        iter_time, data_time = SmoothedValue(fmt="{global_avg:.4f}"), SmoothedValue(fmt="{global_avg:.4f}")
        i = start
        for item in iterable:
            data_time.update(time.time() - last)
            yield item
            iter_time.update(time.time() - last)
            if print_freq > 0 and (i % print_freq == 0 or i == total - 1):
                eta = datetime.timedelta(seconds=int(iter_time.global_avg * (total - 1 - i)))
                log.info(
                    "%s  [%*d/%d]  eta: %s  %s  time: %.4f  data: %.4f",
                    header,
                    width,
                    i,
                    total,
                    eta,
                    self,
                    iter_time.global_avg,
                    data_time.global_avg,
                )
            i += 1
            last = time.time()
        elapsed = datetime.timedelta(seconds=int(time.time() - began))
        done = i - start
        log.info("%s Total time: %s (%.4f s / it)", header, elapsed, (time.time() - began) / max(done, 1))
