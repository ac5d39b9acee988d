"""The alert rules of k8s/components/monitoring/prometheus, evaluated by the real Prometheus binary (Debian's
``prometheus`` package) scraping a real trainer metrics endpoint (:class:`dinops.train.metrics.MetricsServer`).

The rule file's windows are minutes; the copy loaded here has them in seconds, and nothing else changed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from dinops.serve.testing import free_port
from dinops.train.metrics import MetricsServer, TrainMetrics

PROMETHEUS_DIR = Path(__file__).resolve().parents[3] / "k8s" / "components" / "monitoring" / "prometheus"
RULES = PROMETHEUS_DIR / "alerts.yml"
SHORTER = {"[10m]": "[6s]", "[30m]": "[6s]", "for: 5m": "for: 3s", "for: 15m": "for: 3s", "for: 10m": "for: 3s"}


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"the alert tests need Debian's {name}: apt-get install -y prometheus (scripts/system-packages.sh)")
    return path


def test_promtool_accepts_the_rules_and_the_scrape_config():
    for command in (["check", "rules", str(RULES)], ["check", "config", str(PROMETHEUS_DIR / "prometheus.yml")]):
        result = subprocess.run([_binary("promtool"), *command], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
    names = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert names == ["DinopsTrainingStalled", "DinopsDataLoaderStarving", "DinopsGPUIdleDuringTraining",
                     "DinopsDiskFilling"]  # fmt: skip


class Trainer:
    """A trainer's metrics as a running loop moves them: one step every 0.2 s while ``advancing`` is set."""

    def __init__(self, output_dir: Path) -> None:
        self.metrics = TrainMetrics(output_dir)
        self.server = MetricsServer(self.metrics, 0, "127.0.0.1")
        self.metrics.running.set(1)
        self.advancing = threading.Event()
        self.advancing.set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(0.2):
            if self.advancing.is_set():
                self.metrics.step({"loss": 1.0}, 1e-4, step_s=0.2, data_wait_s=0.01)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.server.close()


@pytest.fixture
def stack(tmp_path):
    """The trainer's endpoint, and Prometheus scraping it every second with the shortened rules."""
    text = RULES.read_text()
    for long, short in SHORTER.items():
        text = text.replace(long, short)
    assert not re.search(r"\[\d+m\]|for: \d+m", text), "a window was left in minutes"
    (tmp_path / "alerts.yml").write_text(text)
    trainer = Trainer(tmp_path)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "alerts.yml")],
        "scrape_configs": [
            {"job_name": "dinops-train", "static_configs": [{"targets": [f"127.0.0.1:{trainer.server.port}"]}]}
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:
        process = subprocess.Popen(
            [_binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield trainer, f"http://127.0.0.1:{port}", tmp_path / "prometheus.log"
    finally:
        process.terminate()
        process.wait(timeout=30)
        trainer.close()


def _api(url: str, path: str) -> dict:
    answer = requests.get(url + path, timeout=5)
    answer.raise_for_status()
    return answer.json()["data"]


def _stalled_rule(url: str) -> dict:
    rules = [r for g in _api(url, "/api/v1/rules")["groups"] for r in g["rules"]]
    (rule,) = [r for r in rules if r["name"] == "DinopsTrainingStalled"]
    return rule


def _until(condition, timeout: float, what: str, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except requests.RequestException:
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; Prometheus said:\n{log.read_text()[-2000:]}")


def test_training_stalled_fires_only_when_the_step_counter_stops(stack):
    trainer, url, log = stack
    _until(lambda: _api(url, "/api/v1/query?query=up")["result"], 30, "the first scrape", log)

    # advancing: evaluated again and again over a full window, and inactive every time
    began = time.monotonic()
    while time.monotonic() - began < 10:
        rule = _stalled_rule(url)
        assert rule["health"] == "ok", rule
        assert rule["state"] == "inactive", rule
        time.sleep(0.5)
    steps = _api(url, "/api/v1/query?query=increase(dinops_train_steps_total[6s])")["result"]
    assert steps and float(steps[0]["value"][1]) > 5  # the rule saw a counter that moves, not an empty series

    trainer.advancing.clear()  # the loop hangs: still running, no more steps
    stopped = time.monotonic()
    _until(lambda: _stalled_rule(url)["state"] == "firing", 40, "DinopsTrainingStalled to fire", log)
    assert time.monotonic() - stopped >= 3  # not before the `for` duration
    (alert,) = [a for a in _api(url, "/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == "DinopsTrainingStalled"]
    assert alert["state"] == "firing" and alert["labels"]["severity"] == "critical"
    assert alert["labels"]["job"] == "dinops-train"

    trainer.advancing.set()  # it moves again: the alert resolves
    _until(lambda: _stalled_rule(url)["state"] == "inactive", 30, "DinopsTrainingStalled to resolve", log)
