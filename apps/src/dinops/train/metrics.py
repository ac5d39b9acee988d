"""The trainer's Prometheus metrics, served on ``--metrics-port`` (``DINO_TRAIN_METRICS_PORT``, 9109; 0: off) by
process 0 only.

Names follow Prometheus' naming practices (https://prometheus.io/docs/practices/naming/): the application prefix
``dinops_train_``, base units as suffixes (``_seconds``, ``_bytes``), ``_total`` on counters. The counters count
what this process did (a resumed run starts them again at 0, which ``rate()`` and ``increase()`` handle as a reset).

================================================  =========  ==========================================================
``dinops_train_steps_total``                      counter    optimizer steps
``dinops_train_epoch``                            gauge      the epoch in progress (0-based)
``dinops_train_loss{term}``                       gauge      the last step's loss: ``total``, ``ce``, ``bbox``, ``giou``
``dinops_train_learning_rate``                    gauge      the last step's learning rate (first parameter group)
``dinops_train_images_per_second``                gauge      global images per second over the last steps
``dinops_train_data_wait_seconds_total``          counter    time spent waiting for the data loader's batches
``dinops_train_step_seconds_total``               counter    time spent in steps (waiting for data included)
``dinops_train_last_checkpoint_timestamp_seconds``  gauge    Unix time of the last checkpoint written
``dinops_train_eval_ap{iou}``                     gauge      the last evaluation's bbox AP: ``0.50:0.95``, ``0.50``,
                                                             ``0.75``
``dinops_train_running``                          gauge      1 while the training loop runs, else 0
``dinops_train_evaluating``                       gauge      1 while the loop evaluates (no steps then), else 0
``dinops_train_output_free_bytes``                gauge      free bytes on the output directory's filesystem
================================================  =========  ==========================================================

The share of step time spent waiting for data is ``rate(dinops_train_data_wait_seconds_total[5m]) /
rate(dinops_train_step_seconds_total[5m])``; k8s/components/monitoring/prometheus/alerts.yml alerts on it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

log = logging.getLogger("dinops.train")

LOSS_TERMS = {"loss": "total", "loss_ce": "ce", "loss_bbox": "bbox", "loss_giou": "giou"}
AP_IOUS = ("0.50:0.95", "0.50", "0.75")  # the first three COCO numbers (coco_eval.STAT_NAMES)


class TrainMetrics:
    """The metrics of one training process, in their own registry (two runs in one test process never share)."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.registry = r = CollectorRegistry()
        self.steps = Counter("dinops_train_steps", "optimizer steps done by this process", registry=r)
        self.epoch = Gauge("dinops_train_epoch", "the epoch in progress (0-based)", registry=r)
        self.loss = Gauge("dinops_train_loss", "the last step's weighted loss, by term", ["term"], registry=r)
        self.learning_rate = Gauge("dinops_train_learning_rate", "the last step's learning rate", registry=r)
        self.images_per_second = Gauge(
            "dinops_train_images_per_second", "global training images per second over the last steps", registry=r
        )
        self.data_wait = Counter(
            "dinops_train_data_wait_seconds", "time spent waiting for the data loader's batches", registry=r
        )
        self.step_time = Counter(
            "dinops_train_step_seconds", "time spent in optimizer steps, waiting for data included", registry=r
        )
        self.last_checkpoint = Gauge(
            "dinops_train_last_checkpoint_timestamp_seconds", "Unix time of the last checkpoint written", registry=r
        )
        self.eval_ap = Gauge("dinops_train_eval_ap", "the last evaluation's bbox AP, by IoU range", ["iou"], registry=r)
        self.running = Gauge("dinops_train_running", "1 while the training loop runs", registry=r)
        self.evaluating = Gauge("dinops_train_evaluating", "1 while the training loop evaluates", registry=r)
        self.output_free = Gauge(
            "dinops_train_output_free_bytes", "free bytes on the output directory's filesystem", registry=r
        )
        folder = Path(output_dir)
        self.output_free.set_function(lambda: shutil.disk_usage(folder).free)

    def step(self, losses: dict[str, float], learning_rate: float, step_s: float, data_wait_s: float) -> None:
        self.steps.inc()
        self.step_time.inc(step_s)
        self.data_wait.inc(data_wait_s)
        self.learning_rate.set(learning_rate)
        for key, term in LOSS_TERMS.items():
            if key in losses:
                self.loss.labels(term).set(losses[key])

    def evaluated(self, stats: list[float]) -> None:
        for iou, value in zip(AP_IOUS, stats, strict=False):
            self.eval_ap.labels(iou).set(value)


class MetricsServer:
    """:class:`TrainMetrics` served over HTTP at ``/metrics`` (any path answers) on ``addr:port``; port 0 binds a
    free port (``self.port`` says which). Stop it with :meth:`close`."""

    def __init__(self, metrics: TrainMetrics, port: int, addr: str = "0.0.0.0") -> None:
        self.metrics = metrics
        self.server, self.thread = start_http_server(port, addr, registry=metrics.registry)
        self.port = self.server.server_port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
