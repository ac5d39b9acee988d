"""The metric names of the API and of the trainer follow Prometheus' conventions, as Prometheus' own linter reads them:
`promtool check metrics` (Debian's prometheus 2.42, the deployment's Prometheus) on what each serves after real use.

promtool's lint (prometheus/prometheus v2.42.0, util/promlint/promlint.go, the naming practices of
https://prometheus.io/docs/practices/naming/): snake_case names, help text on every metric, counters ending in
``_total``, base units (seconds, bytes) instead of milliseconds or kilobytes, no ``_count``/``_sum``/``_bucket``
suffix outside histograms and summaries, no type name in the name. It prints each problem and exits 3 when there is
one; one test feeds it a wrongly named metric, so a check that never fails would show.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest
from PIL import Image
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from dinops.train.metrics import MetricsServer, TrainMetrics


def _lint(text: bytes) -> tuple[int, str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("the metric-name check needs Debian's promtool: apt-get install -y prometheus")
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False)
    return done.returncode, (done.stdout + done.stderr).decode()


def test_promtool_finds_a_wrongly_named_metric():
    registry = CollectorRegistry()
    Gauge("dinops_latency_milliseconds", "a latency in the wrong unit", registry=registry).set(3)
    Counter("dinopsRequests", "camel case", registry=registry).inc()
    code, said = _lint(generate_latest(registry))
    assert code != 0 and 'use base unit "seconds" instead of "milliseconds"' in said, said
    assert "camelCase" in said, said


def test_the_apis_metrics_after_requests_follow_the_conventions(client, encode):
    image = encode(Image.new("RGB", (64, 48), "white"))
    assert client.post("/v1/detect", data=image, content_type="image/png").status_code == 200
    assert client.post("/v1/detect", data=b"not an image", content_type="image/png").status_code == 415
    assert client.get("/nowhere").status_code == 404
    answer = client.get("/metrics")
    assert answer.status_code == 200 and b"dino_http_requests_total" in answer.data
    code, said = _lint(answer.data)
    assert code == 0 and not said.strip(), said


def test_the_trainers_metrics_served_over_http_follow_the_conventions(tmp_path):
    metrics = TrainMetrics(tmp_path)
    server = MetricsServer(metrics, 0, "127.0.0.1")
    try:
        metrics.running.set(1)
        metrics.step({"loss": 1.2, "loss_ce": 0.4, "loss_bbox": 0.5, "loss_giou": 0.3}, 1e-4, step_s=0.3,
                     data_wait_s=0.02)  # fmt: skip
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as answer:
            text = answer.read()
    finally:
        server.close()
    assert b"dinops_train_steps_total 1.0" in text
    code, said = _lint(text)
    assert code == 0 and not said.strip(), said
