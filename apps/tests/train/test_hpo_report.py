"""`dinops hpo report` on Katib v0.19.0 Experiment and Trial objects as `kubectl get -o json` prints them.

The objects are built here to the shapes of Katib's swagger (kubeflow/katib@v0.19.0:pkg/apis/v1beta1/swagger.json,
copied to shared/crds/katib-v0.19.0-swagger.json): every metric value is a string, ``Metric{name,min,max,latest}``,
``TrialStatus{conditions,observation,...}``. A test validates them against those definitions so they cannot drift.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dinops.train import hpo

SWAGGER = Path(os.environ.get("DINOPS_SHARED_DIR", Path(__file__).resolve().parents[4] / "shared")) / "crds"
SWAGGER = SWAGGER / "katib-v0.19.0-swagger.json"
NAME, NAMESPACE = "dinops-hpo", "dinops"
API = "kubeflow.org/v1beta1"
METRIC_NAMES = ("bbox_ap", "bbox_ap50", "bbox_ap75", "loss", "epoch")

# ---- objects as Katib writes them --------------------------------------------------------------------------------


def _time(minute: int) -> str:
    return f"2026-11-24T{9 + minute // 60:02d}:{minute % 60:02d}:00Z"


def _condition(kind: str, status: str, minute: int, reason: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason or f"Trial{kind}",
        "message": f"Trial is {kind.lower()}",
        "lastUpdateTime": _time(minute),
        "lastTransitionTime": _time(minute),
    }


OBJECTIVE = {
    "type": "maximize",
    "goal": 0.9,
    "objectiveMetricName": "bbox_ap",
    "additionalMetricNames": ["bbox_ap50", "bbox_ap75", "loss", "epoch"],
    # bbox_ap50 and bbox_ap75 left to Katib's default (the objective's direction: max)
    "metricStrategies": [
        {"name": "bbox_ap", "value": "max"},
        {"name": "loss", "value": "min"},
        {"name": "epoch", "value": "latest"},
    ],
}
PARAMETERS = [
    {"name": "lr", "parameterType": "double",
     "feasibleSpace": {"min": "1e-05", "max": "0.001", "distribution": "logUniform"}},
    {"name": "batch_size", "parameterType": "int",
     "feasibleSpace": {"min": "2", "max": "8", "distribution": "uniform"}},
    {"name": "weight_decay", "parameterType": "double",
     "feasibleSpace": {"min": "0.00001", "max": "0.01", "distribution": "uniform"}},
    {"name": "amp", "parameterType": "categorical", "feasibleSpace": {"list": ["none", "bf16"]}},
]  # fmt: skip


def _metrics(ap: tuple[float, float, float] | None, epochs: int = 12) -> list[dict[str, str]]:
    if ap is None:  # what Katib stores when the objective never appeared in the output
        return [{"name": "bbox_ap", "min": "unavailable", "max": "unavailable", "latest": "unavailable"}]
    low, high, last = ap
    return [
        {"name": "bbox_ap", "min": repr(low), "max": repr(high), "latest": repr(last)},
        {"name": "bbox_ap50", "min": repr(low + 0.2), "max": repr(high + 0.2), "latest": repr(last + 0.2)},
        {"name": "bbox_ap75", "min": repr(low / 2), "max": repr(high / 2), "latest": repr(last / 2)},
        {"name": "loss", "min": repr(10 - 10 * high), "max": "14.3483", "latest": repr(10.5 - 10 * high)},
        {"name": "epoch", "min": "0", "max": str(epochs - 1), "latest": str(epochs - 1)},
    ]


# (trial suffix, state, lr, batch size, weight decay, amp, (min, max, latest) bbox_ap or None)
TRIALS = [
    ("7dq5x2bn", "Succeeded", "0.0002", "4", "0.0001", "bf16", (0.05, 0.52, 0.51)),
    ("c4pw9hzr", "Succeeded", "1e-05", "8", "0.005", "none", (0.01, 0.31, 0.31)),
    ("k2m8tf6v", "Succeeded", "0.0009", "2", "0.0003", "bf16", (0.02, 0.45, 0.40)),
    ("p9r3nq1w", "EarlyStopped", "5e-05", "6", "0.002", "none", (0.0, 0.12, 0.12)),
    ("v6h2jd8s", "MetricsUnavailable", "0.0001", "4", "0.0001", "none", None),
    ("x1b7lc4e", "Failed", "0.0005", "8", "0.008", "bf16", "no observation"),
    ("z8f4wm2k", "Running", "0.0003", "2", "0.00002", "none", "no observation"),
]
BEST = f"{NAME}-7dq5x2bn"
SORTED = [f"{NAME}-{t}" for t in ("7dq5x2bn", "k2m8tf6v", "c4pw9hzr", "p9r3nq1w", "v6h2jd8s", "x1b7lc4e", "z8f4wm2k")]


def trial(suffix, state, lr, batch, decay, amp, ap, experiment=NAME) -> dict[str, Any]:
    name = f"{experiment}-{suffix}"
    conditions = [_condition("Created", "True", 0, "TrialCreated")]
    if state != "Created":
        conditions.append(_condition("Running", "False" if state != "Running" else "True", 1, "TrialRunning"))
    if state not in ("Created", "Running"):
        conditions.append(_condition(state, "True", 30))
    status: dict[str, Any] = {"startTime": _time(0), "conditions": conditions, "lastReconcileTime": _time(30)}
    if ap != "no observation":
        status["observation"] = {"metrics": _metrics(ap)}
    if state not in ("Created", "Running"):
        status["completionTime"] = _time(30)
    assignments = {"lr": lr, "batch_size": batch, "weight_decay": decay, "amp": amp}
    return {
        "apiVersion": API,
        "kind": "Trial",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"katib.kubeflow.org/experiment": experiment},
            "ownerReferences": [
                {"apiVersion": API, "kind": "Experiment", "name": experiment, "uid": "0b6f", "controller": True}
            ],
            "uid": f"uid-{suffix}",
            "resourceVersion": "4711",
            "creationTimestamp": _time(0),
        },
        "spec": {
            "objective": OBJECTIVE,
            "parameterAssignments": [{"name": k, "value": v} for k, v in assignments.items()],
            "primaryContainerName": "node",
            "successCondition": 'status.conditions.#(type=="Complete")#|#(status=="True")#',
            "failureCondition": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
            "metricsCollector": {"collector": {"kind": "StdOut"}},
            "runSpec": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name}},
            "labels": {"katib.kubeflow.org/experiment": experiment},
        },
        "status": status,
    }


def experiment(trials: list[dict[str, Any]], name: str = NAME, condition: str = "Succeeded") -> dict[str, Any]:
    states = {t["metadata"]["name"]: hpo.trial_state(t) for t in trials}
    best = next(t for t in trials if t["metadata"]["name"] == BEST) if BEST in states else None
    status: dict[str, Any] = {
        "startTime": _time(0),
        "completionTime": _time(90),
        "conditions": [
            {"type": "Created", "status": "True", "reason": "ExperimentCreated", "lastUpdateTime": _time(0)},
            {"type": "Running", "status": "False", "reason": "ExperimentRunning", "lastUpdateTime": _time(90)},
            {"type": condition, "status": "True", "reason": "ExperimentMaxTrialsReached", "lastUpdateTime": _time(90)},
        ],
        "trials": len(trials),
        "trialsSucceeded": sum(s == "Succeeded" for s in states.values()),
        "trialsFailed": sum(s == "Failed" for s in states.values()),
        "trialsRunning": sum(s == "Running" for s in states.values()),
        "trialsEarlyStopped": sum(s == "EarlyStopped" for s in states.values()),
        "trialMetricsUnavailable": sum(s == "MetricsUnavailable" for s in states.values()),
        "succeededTrialList": sorted(n for n, s in states.items() if s == "Succeeded"),
    }
    if best is not None:
        status["currentOptimalTrial"] = {
            "bestTrialName": BEST,
            "parameterAssignments": best["spec"]["parameterAssignments"],
            "observation": best["status"]["observation"],
        }
    return {
        "apiVersion": API,
        "kind": "Experiment",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "0b6f", "generation": 1},
        "spec": {
            "objective": OBJECTIVE,
            "algorithm": {"algorithmName": "tpe", "algorithmSettings": [{"name": "random_state", "value": "10"}]},
            "earlyStopping": {
                "algorithmName": "medianstop", "algorithmSettings": [{"name": "min_trials_required", "value": "3"}]
            },
            "parameters": PARAMETERS,
            "parallelTrialCount": 1,
            "maxTrialCount": 7,
            "maxFailedTrialCount": 3,
            "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
            "resumePolicy": "Never",
            "trialTemplate": {
                "primaryContainerName": "node",
                "retain": False,
                "trialParameters": [
                    {"name": p["name"], "reference": p["name"], "description": p["name"]} for p in PARAMETERS
                ],
                "trialSpec": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob"},
            },
        },
        "status": status,
    }  # fmt: skip


def kubectl_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """What `kubectl get ... -o json` prints for several objects."""
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


@pytest.fixture
def objects() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    trials = [trial(*t) for t in TRIALS]
    return experiment(trials), trials


@pytest.fixture
def files(tmp_path, objects) -> tuple[Path, Path]:
    exp, trials = objects
    (tmp_path / "experiment.json").write_text(json.dumps(exp, indent=2))
    (tmp_path / "trials.json").write_text(json.dumps(kubectl_list(trials), indent=2))
    return tmp_path / "experiment.json", tmp_path / "trials.json"


# ---- the fixtures follow the swagger -----------------------------------------------------------------------------

# Kubernetes types the swagger refers to without defining them (apimachinery's ObjectMeta, Time, ...).
EXTERNAL = {
    "v1.ObjectMeta": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "ownerReferences": {"type": "array", "items": {"type": "object"}},
        },
    },
    "v1.ListMeta": {"type": "object"},
    "v1.Time": {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$"},
    "v1.unstructured.Unstructured": {"type": "object"},
    "v1.Container": {"type": "object"},
    "v1.HTTPGetAction": {"type": "object"},
}


def _strict(node: Any) -> Any:
    """A swagger schema as a validator that refuses fields the definition does not name (defaults dropped)."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if k not in ("default", "properties", "description")}
    if "properties" in node:
        out["properties"] = {name: _strict(sub) for name, sub in node["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def swagger_errors(obj: dict[str, Any]) -> list[str]:
    jsonschema = pytest.importorskip("jsonschema")
    if not SWAGGER.is_file():
        pytest.skip(f"Katib swagger not found at {SWAGGER} (set DINOPS_SHARED_DIR to the shared/ folder)")
    definitions = {name: _strict(d) for name, d in json.loads(SWAGGER.read_text())["definitions"].items()}
    definitions |= EXTERNAL
    root = dict(definitions[{"Experiment": "v1beta1.Experiment", "Trial": ".v1beta1.Trial"}[obj["kind"]]])
    root["definitions"] = definitions
    validator = jsonschema.Draft7Validator(root)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def test_fixtures_follow_the_katib_swagger(objects):
    exp, trials = objects
    for obj in (exp, *trials):
        assert swagger_errors(obj) == [], obj["metadata"]["name"]
    # the check can fail: a number where Katib stores a string, a field Katib does not have
    bad = copy.deepcopy(trials[0])
    bad["status"]["observation"]["metrics"][0]["max"] = 0.52
    bad["status"]["observation"]["metrics"][1]["value"] = "0.7"
    errors = swagger_errors(bad)
    assert any("0.52 is not of type 'string'" in e for e in errors)
    assert any("'value' was unexpected" in e for e in errors)


# ---- the report --------------------------------------------------------------------------------------------------


def _table(text: str) -> list[list[str]]:
    rows = [line for line in text.split("## Trials, best first")[1].splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows if not row.startswith("|---")]


def test_report_from_experiment_and_trials_files(files, tmp_path, capsys):
    out = tmp_path / "report"
    assert hpo.main(["report", str(files[0]), str(files[1]), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text == (out / "report.md").read_text()
    assert "# Katib experiment dinops-hpo" in text
    assert (
        "- status: Succeeded; trials: 7 (1 EarlyStopped, 1 Failed, 1 MetricsUnavailable, 1 Running, 3 Succeeded)"
        in text
    )
    assert "- objective: maximize bbox_ap (goal 0.9); algorithm: tpe" in text
    optimal = text.split("## Current optimal trial (Katib)")[1].split("##")[0]
    assert (
        f"- trial: {BEST}" in optimal
        and "- parameters: lr=0.0002, batch_size=4, weight_decay=0.0001, amp=bf16" in optimal
    )
    assert "bbox_ap min 0.05 max 0.52 latest 0.51" in optimal and "note:" not in optimal
    header, *rows = _table(text)
    assert header == [
        "best", "trial", "status", "lr", "batch_size", "weight_decay", "amp",
        "bbox_ap (max)", "bbox_ap50 (max)", "bbox_ap75 (max)", "loss (min)", "epoch (latest)",
    ]  # fmt: skip
    assert [r[1] for r in rows] == SORTED
    assert [r[0] for r in rows] == ["yes"] + [""] * 6
    assert rows[0] == ["yes", BEST, "Succeeded", "0.0002", "4", "0.0001", "bf16", "0.52", "0.72", "0.26", "4.8", "11"]
    assert rows[3][2:3] + rows[3][7:8] == ["EarlyStopped", "0.12"]
    assert rows[4][2] == "MetricsUnavailable" and rows[4][7] == "unavailable" and rows[4][8:] == ["", "", "", ""]
    assert rows[5][2] == "Failed" and rows[5][7:] == [""] * 5 and rows[6][2] == "Running"
    for name in ("lr", "batch_size", "weight_decay", "amp"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f"[{name}.png]({name}.png)" in text
    assert not (out / "trials.csv").exists()


def test_csv_holds_the_same_table(files, tmp_path, capsys):
    out = tmp_path / "report"
    assert hpo.main(["report", str(files[0]), str(files[1]), "--out", str(out), "--csv"]) == 0
    table = _table(capsys.readouterr().out)
    with open(out / "trials.csv", newline="") as fh:
        assert list(csv.reader(fh)) == table


def test_kubectl_get_experiment_and_trials_in_one_list_from_stdin(objects, tmp_path, capsys, caplog):
    exp, trials = objects
    other_trials = [trial("aaaa1111", "Succeeded", "0.1", "2", "0.1", "none", (0.0, 0.99, 0.99), experiment="other")]
    # `kubectl get experiment,trials -n dinops -o json` in a namespace with a second experiment
    listing = kubectl_list([exp, experiment(other_trials, name="other"), *trials, *other_trials])
    assert hpo.main(["report", "-", "--out", str(tmp_path / "a")], stdin=io.StringIO(json.dumps(listing))) == 2
    assert "2 experiments in the input (dinops-hpo, other): choose one with --experiment" in caplog.text
    stdin = io.StringIO(json.dumps(listing))
    assert hpo.main(["report", "-", "--experiment", NAME, "--out", str(tmp_path / "b")], stdin=stdin) == 0
    assert [r[1] for r in _table(capsys.readouterr().out)[1:]] == SORTED  # the other experiment's trial left out


def test_log_axis_for_log_uniform_and_wide_ranges(files, tmp_path, monkeypatch):
    scales = {}
    real_save = hpo._save

    def save(fig, path):
        scales[path.stem] = fig.axes[0].get_xscale()
        return real_save(fig, path)

    monkeypatch.setattr(hpo, "_save", save)
    assert hpo.main(["report", str(files[0]), str(files[1]), "--out", str(tmp_path)]) == 0
    # logUniform; uniform over 1e-5..1e-2 (1000x); uniform 2..8 (4x); categorical
    assert scales == {"lr": "log", "weight_decay": "log", "batch_size": "linear", "amp": "linear"}
    assert hpo.Parameter("x", "double", {"min": "1", "max": "99"}).log_axis([1.0, 99.0]) is False
    assert hpo.Parameter("x", "double", {"min": "1", "max": "100"}).log_axis([1.0, 100.0]) is True
    assert hpo.Parameter("x", "double", {"min": "-1", "max": "100"}).log_axis([]) is False


# ---- bad input: one line, exit 2, no traceback ------------------------------------------------------------------


def _write(tmp_path: Path, name: str, doc: Any) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("not_json", "experiment.json: not JSON (Expecting value: line 1 column 1 (char 0))"),
        ("not_experiment", "no Experiment (kubeflow.org/v1beta1) in the input, found Pod/dinops-train-abcde"),
        ("other_trials", "trial elsewhere-aaaa1111 belongs to experiment elsewhere, not dinops-hpo"),
        ("none_finished", "experiment dinops-hpo has no finished trial (dinops-hpo-z8f4wm2k Running)"),
        (
            "unavailable",
            "no finished trial has a value of the objective bbox_ap (dinops-hpo-7dq5x2bn Succeeded "
            "bbox_ap=unavailable, ",
        ),
        ("not_katib", "not a Katib Experiment or Trial: Job/dinops-train"),
        ("missing", "nonexistent.json: cannot read"),
        ("shape", "Trial/dinops-hpo-7dq5x2bn: status.observation.metrics should be list, got dict"),
        ("no_name", "Trial/dinops-hpo-7dq5x2bn: spec.parameterAssignments should be a list of objects with a 'name'"),
        ("mistyped", "Experiment/dinops-hpo: spec.parameters should be list, got dict"),
    ],
)
def test_bad_input_is_named_with_exit_2(case, message, objects, tmp_path, caplog):
    exp, trials = objects
    docs: list[Any] = [exp, kubectl_list(trials)]
    if case == "not_json":
        docs[0] = 'Error from server (NotFound): experiments.kubeflow.org "dinops-hpo" not found\n'
    elif case == "not_experiment":
        docs[0] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dinops-train-abcde"}}
    elif case == "other_trials":
        docs[1] = kubectl_list(
            [*trials, trial("aaaa1111", "Succeeded", "0.1", "2", "0.1", "none", (0, 0.9, 0.9), "elsewhere")]
        )
    elif case == "none_finished":
        docs[1] = kubectl_list([trials[-1]])
    elif case == "unavailable":
        docs[1] = kubectl_list([trial(*t[:6], None) for t in TRIALS[:4]] + trials[5:])
    elif case == "not_katib":
        docs[1] = kubectl_list(
            [*trials, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "dinops-train"}}]
        )
    elif case == "shape":
        trials[0]["status"]["observation"]["metrics"] = {"bbox_ap": "0.5"}
    elif case == "no_name":
        trials[0]["spec"]["parameterAssignments"][0] = {"value": "0.1"}
    elif case == "mistyped":
        exp["spec"]["parameters"] = {"lr": {}}
    paths = [_write(tmp_path, "experiment.json", docs[0]), _write(tmp_path, "trials.json", docs[1])]
    if case == "missing":
        paths[1] = str(tmp_path / "nonexistent.json")
    assert hpo.main(["report", *paths, "--out", str(tmp_path / "out")]) == 2
    assert message in caplog.text, caplog.text
    assert not (tmp_path / "out" / "report.md").exists()


def test_the_command_line(files, tmp_path):
    """`dinops hpo report` through the dispatcher: a report, then a bad file: one line on stderr, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")}
    cmd = [sys.executable, "-m", "dinops.cli", "hpo", "report"]
    done = subprocess.run([*cmd, *map(str, files), "--out", str(tmp_path / "r"), "--csv"], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert BEST in done.stdout and (tmp_path / "r" / "trials.csv").is_file()
    assert f"wrote {tmp_path / 'r' / 'report.md'}" in done.stderr
    bad = _write(
        tmp_path, "bad.json", {"apiVersion": API, "kind": "Experiment", "metadata": {"name": NAME}, "spec": []}
    )
    done = subprocess.run(
        [*cmd, bad, "--out", str(tmp_path / "x")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "dinops hpo report: Experiment/dinops-hpo: spec should be an object, got list"
    ]
    with pytest.raises(SystemExit) as usage:  # `dinops hpo` without its subcommand: argparse's usage error
        hpo.main([])
    assert usage.value.code == 2
