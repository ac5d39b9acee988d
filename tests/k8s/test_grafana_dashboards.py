"""The Grafana dashboards of k8s/components/monitoring/grafana: Grafana's JSON dashboard model with the fields an
import needs, every query valid PromQL for the real promtool (Debian's Prometheus 2.42, the one dinops runs), and
every metric name one that exists: the trainer's and the API's from their own registries, DCGM's from the counters
the pinned exporter collects (tests/k8s/test_dcgm_exporter.py keeps that list with its citation).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from k8s.k8s_render import K8S
from k8s.test_dcgm_exporter import COLLECTED_COUNTERS
from prometheus_client import CollectorRegistry

from dinops.serve.metrics import Metrics
from dinops.train.metrics import TrainMetrics

GRAFANA = K8S / "components" / "monitoring" / "grafana"
DASHBOARDS = ("dinops-api.json", "dinops-gpu.json", "dinops-training.json")
# The latest dashboard schema version: grafana/grafana apps/dashboard/pkg/migration/schemaversion/migrations.go
# (LATEST_VERSION = 42). Older Grafanas (11.x knows up to 39-40) load a newer one as it is.
SCHEMA_VERSION = 42
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Which scrape job each dashboard reads (k8s/components/monitoring/prometheus/prometheus.yml).
JOBS = {"dinops-training.json": "dinops-train", "dinops-api.json": "dinops-serve", "dinops-gpu.json": "dcgm-exporter"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
                "inf", "nan"}  # fmt: skip


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """The series names a registry exposes, as the text exposition writes them: a counter family `x` as `x_total`, a
    histogram's `_bucket`, `_sum` and `_count` (https://prometheus.io/docs/instrumenting/exposition_formats/)."""
    names = set()
    for family in registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
                    "summary": ("", "_sum", "_count")}[family.type]  # fmt: skip
        names.update(family.name + suffix for suffix in suffixes)
    return names


@pytest.fixture(scope="module")
def known_metrics(tmp_path_factory) -> set[str]:
    train = TrainMetrics(tmp_path_factory.mktemp("train-output"))
    return exposed_names(train.registry) | exposed_names(Metrics().registry) | set(COLLECTED_COUNTERS)


def load(name: str) -> dict:
    return json.loads((GRAFANA / name).read_text())


def targets(dashboard: dict):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions (followed by "("), keywords,
    label names (inside {...} or the parentheses of by/without/on/ignoring), durations ([5m]) or strings."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("(") or match.group().lower() in PROMQL_WORDS:
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent of 2e9
        names.add(match.group())
    return names


def promtool_check(exprs: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`promtool check rules` on one recording rule per expression: the real parser of Prometheus 2.42."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("the dashboard tests need Debian's promtool: apt-get install -y prometheus")
    rules = {"groups": [{"name": "dashboards", "rules": [{"record": r, "expr": e} for r, e in exprs.items()]}]}
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_the_folder_holds_the_three_dashboards_and_their_readme():
    assert sorted(p.name for p in GRAFANA.glob("*.json")) == sorted(DASHBOARDS)
    assert (GRAFANA / "README.md").is_file()


@pytest.mark.parametrize("name", DASHBOARDS)
def test_each_dashboard_has_the_model_fields_an_import_needs(name):
    dashboard = load(name)
    assert isinstance(dashboard["title"], str) and dashboard["title"].strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"]), "Grafana's uid: at most 40 characters"
    assert dashboard["schemaVersion"] == SCHEMA_VERSION
    assert "id" not in dashboard or dashboard["id"] is None, "an id belongs to one Grafana's database"
    # The data source is a variable the user picks: no UID of anyone's Grafana in the file.
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert (variable["name"], variable["query"]) == ("datasource", "prometheus")
    panels = dashboard["panels"]
    assert panels
    assert len({p["id"] for p in panels}) == len(panels), "panel ids are unique"
    for panel in panels:
        where = f"{name} panel {panel.get('id')} {panel.get('title')!r}"
        assert isinstance(panel["id"], int) and panel["type"] and panel["title"], where
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h")), where
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, where
        assert panel["datasource"] == DATASOURCE, where
        assert panel["targets"], where
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs) and all(refs), where
        for target in panel["targets"]:
            assert isinstance(target["expr"], str) and target["expr"].strip(), where
            assert target["datasource"] == DATASOURCE, where


def test_uids_and_titles_are_unique_across_dashboards():
    dashboards = [load(name) for name in DASHBOARDS]
    assert len({d["uid"] for d in dashboards}) == len(dashboards)
    assert len({d["title"] for d in dashboards}) == len(dashboards)


def test_panels_do_not_overlap():
    for name in DASHBOARDS:
        cells: dict[tuple[int, int], int] = {}
        for panel in load(name)["panels"]:
            grid = panel["gridPos"]
            for x in range(grid["x"], grid["x"] + grid["w"]):
                for y in range(grid["y"], grid["y"] + grid["h"]):
                    assert (x, y) not in cells, f"{name}: panels {cells.get((x, y))} and {panel['id']} overlap"
                    cells[(x, y)] = panel["id"]


def test_every_query_is_valid_promql_for_promtool(tmp_path):
    exprs = {}
    for name in DASHBOARDS:
        dashboard = load(name)
        for panel, target in targets(dashboard):
            record = f"dashboard:{dashboard['uid'].replace('-', '_')}:panel{panel['id']}_{target['refId']}"
            exprs[record] = target["expr"]
    result = promtool_check(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


def test_promtool_rejects_a_broken_query(tmp_path):
    """The check above can fail: an unbalanced parenthesis is refused."""
    result = promtool_check({"dashboard:broken": "sum(rate(dinops_train_steps_total[5m])"}, tmp_path)
    assert result.returncode != 0


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_metric_exists_and_is_read_from_its_job(name, known_metrics):
    unknown, off_job = [], []
    for panel, target in targets(load(name)):
        names = metric_names(target["expr"])
        assert names, f"{name} panel {panel['id']}: no metric in {target['expr']!r}"
        unknown += sorted(names - known_metrics)
        # Every selector names its scrape job, so that another target's series of the same name never mix in.
        for metric in names:
            for found in re.finditer(rf"(?<![\w:]){re.escape(metric)}(?![\w:])(\{{[^}}]*\}})?", target["expr"]):
                if f'job="{JOBS[name]}"' not in (found.group(1) or ""):
                    off_job.append(f"{metric} in {target['expr']}")
    assert unknown == [], f"metrics that neither app registers nor the pinned DCGM exporter collects: {unknown}"
    assert off_job == []


def test_the_metric_name_check_can_fail(known_metrics):
    """A misspelt name is not known; a function, a label or a keyword is not taken for a metric."""
    expr = 'sum by (le) (rate(dino_http_request_duration_secnds_bucket{job="dinops-serve", status=~"5.."}[5m])) > 2e9'
    assert metric_names(expr) == {"dino_http_request_duration_secnds_bucket"}
    assert metric_names(expr) - known_metrics == {"dino_http_request_duration_secnds_bucket"}
    assert "dinops_train_steps_total" in known_metrics and "dinops_train_steps" not in known_metrics
