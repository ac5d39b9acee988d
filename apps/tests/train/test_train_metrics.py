"""The trainer's Prometheus endpoint, scraped over HTTP while a real (tiny, CPU) training run goes on, and what
progress.json says once it is over."""

from __future__ import annotations

import json
import logging
import socket
import threading

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from dinops.serve.testing import free_port
from dinops.train.main import main
from dinops.train.metrics import MetricsServer, TrainMetrics
from dinops.train.monitor import Monitor

from .conftest import tiny_train_args

NAMES = {
    "dinops_train_steps": "counter",
    "dinops_train_epoch": "gauge",
    "dinops_train_loss": "gauge",
    "dinops_train_learning_rate": "gauge",
    "dinops_train_images_per_second": "gauge",
    "dinops_train_data_wait_seconds": "counter",
    "dinops_train_step_seconds": "counter",
    "dinops_train_last_checkpoint_timestamp_seconds": "gauge",
    "dinops_train_eval_ap": "gauge",
    "dinops_train_running": "gauge",
    "dinops_train_output_free_bytes": "gauge",
}


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of one real scrape, with the families' types checked."""
    answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    answer.raise_for_status()
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        if family.name in NAMES:
            assert family.type == NAMES[family.name], family.name
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_a_training_run_is_scraped_while_it_runs(train_synth, tmp_path, no_dino_env):
    port = free_port()
    during: list[dict] = []
    done = threading.Event()

    def scraper():  # training must run in the main thread (it installs signal handlers): scrape from here
        while not done.is_set():
            try:
                samples = scrape(port)
            except requests.RequestException:
                samples = None
            if samples and samples.get(("dinops_train_steps_total", ())):
                during.append(samples)
            done.wait(0.25)

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        status = main(tiny_train_args(train_synth, tmp_path, "--epochs", "2", "--metrics-port", str(port)))
    finally:
        done.set()
        thread.join()
    assert status == 0
    assert during, "no scrape saw a step"
    last = during[-1]
    assert {name for name, _ in last} >= {
        "dinops_train_steps_total",
        "dinops_train_epoch",
        "dinops_train_learning_rate",
        "dinops_train_images_per_second",
        "dinops_train_data_wait_seconds_total",
        "dinops_train_step_seconds_total",
        "dinops_train_last_checkpoint_timestamp_seconds",
        "dinops_train_running",
        "dinops_train_output_free_bytes",
    }
    running = [s[("dinops_train_running", ())] for s in during]
    assert 1.0 in running
    steps = [s[("dinops_train_steps_total", ())] for s in during]
    assert steps == sorted(steps) and 1 <= steps[-1] <= 16
    assert last[("dinops_train_learning_rate", ())] == pytest.approx(2e-4)
    for term in ("total", "ce", "bbox", "giou"):
        assert last[("dinops_train_loss", (("term", term),))] > 0
    assert 0 < last[("dinops_train_data_wait_seconds_total", ())] < last[("dinops_train_step_seconds_total", ())]
    assert last[("dinops_train_images_per_second", ())] > 0
    assert last[("dinops_train_output_free_bytes", ())] > 0
    with pytest.raises(requests.ConnectionError):  # the run is over: its endpoint is closed
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)

    doc = json.loads((tmp_path / "progress.json").read_text())
    assert (doc["state"], doc["epoch"], doc["epochs"], doc["global_step"], doc["total_steps"]) == ("done", 1, 2, 16, 16)
    assert [e["epoch"] for e in doc["evaluations"]] == [0, 1]
    assert doc["checkpoint"]["path"] == str(tmp_path / "checkpoint.pth") and doc["checkpoint"]["epochs_done"] == 2
    assert [x for x, _ in doc["loss_curve"]] == list(range(1, 17))
    assert doc["eta_s"] == 0 and doc["images_per_s"] > 0
    assert "gpu" not in doc  # a CPU run


def test_evaluation_and_checkpoint_metrics(tmp_path):
    metrics = TrainMetrics(tmp_path)
    server = MetricsServer(metrics, 0, "127.0.0.1")
    try:
        metrics.evaluated([0.41, 0.62, 0.43])
        metrics.last_checkpoint.set(1_800_000_000)
        metrics.step({"loss": 3.0, "loss_ce": 1.0, "class_error": 50.0}, 1e-4, step_s=0.5, data_wait_s=0.2)
        metrics.step({"loss": 2.0, "loss_ce": 0.5}, 1e-4, step_s=0.5, data_wait_s=0.1)
        samples = scrape(server.port)
    finally:
        server.close()
    assert samples[("dinops_train_eval_ap", (("iou", "0.50:0.95"),))] == pytest.approx(0.41)
    assert samples[("dinops_train_eval_ap", (("iou", "0.50"),))] == pytest.approx(0.62)
    assert samples[("dinops_train_eval_ap", (("iou", "0.75"),))] == pytest.approx(0.43)
    assert samples[("dinops_train_last_checkpoint_timestamp_seconds", ())] == 1_800_000_000
    assert samples[("dinops_train_steps_total", ())] == 2
    assert samples[("dinops_train_step_seconds_total", ())] == pytest.approx(1.0)
    assert samples[("dinops_train_data_wait_seconds_total", ())] == pytest.approx(0.3)
    assert samples[("dinops_train_loss", (("term", "total"),))] == 2.0
    assert not any(labels == (("term", "class_error"),) for _, labels in samples)  # not a loss term


def test_only_process_0_reports_and_a_taken_port_is_not_fatal(tmp_path, caplog):
    port = free_port()
    other = Monitor(tmp_path / "rank1", port, active=False)
    other.state("training", epoch=0)
    other.checkpointed(tmp_path / "rank1" / "checkpoint.pth", 1, 8)
    other.close()
    assert not (tmp_path / "rank1").exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", port))
        taken.listen()
        with caplog.at_level(logging.WARNING, "dinops.train"):
            monitor = Monitor(tmp_path / "rank0", port, active=True)
        monitor.close()
    assert f"training metrics not served: port {port}" in caplog.text
    assert json.loads((tmp_path / "rank0" / "progress.json").read_text())["state"] == "waiting_for_data"


def test_a_run_that_cannot_start_says_why(tmp_path, no_dino_env):
    status = main(tiny_train_args(tmp_path / "no-data", tmp_path / "out"))
    assert status == 2
    doc = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert doc["state"] == "failed" and "no-data" in doc["reason"], doc
