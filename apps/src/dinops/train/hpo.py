"""`dinops hpo report`: the results of a finished Katib hyperparameter search, as a table and plots.

Reads the Experiment and its Trials as ``kubectl`` prints them (Katib v0.19.0, ``kubeflow.org/v1beta1``)::

    kubectl get experiment dinops-hpo -n dinops -o json > experiment.json
    kubectl get trials -n dinops -l katib.kubeflow.org/experiment=dinops-hpo -o json > trials.json
    dinops hpo report experiment.json trials.json --csv

    kubectl get experiment,trials -n dinops -o json | dinops hpo report -

and writes into ``--out`` (default ``hpo-report``)::

    report.md     the experiment, its current optimal trial (Katib's), and every trial sorted by the objective
                  (best first, marked): status, every parameter assignment, every observed metric
    trials.csv    the same table (with --csv)
    <param>.png   one plot per parameter: its value against the objective (log x-axis for a logUniform
                  parameter or one spanning 100x or more)

The report also goes to stdout. Exit status 0, or 2 with one line saying what is wrong with the input (not JSON,
no Experiment, trials of another experiment, no finished trial, an objective Katib recorded as 'unavailable').
Metric values are the strings Katib stores; the value of each metric is picked as Katib picks it (its
``metricStrategies``: min, max or latest).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dinops.train.analyze import _save  # noqa: E402  (the plots' conventions: tight layout, Agg, closed figures)

log = logging.getLogger("dinops.hpo")

API_VERSION = "kubeflow.org/v1beta1"
# kubeflow/katib@v0.19.0:pkg/controller.v1beta1/consts/const.go lines 67 and 155
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
UNAVAILABLE = "unavailable"
# A trial's state, in the order Katib's experiment status counts it
# (kubeflow/katib@v0.19.0:pkg/controller.v1beta1/experiment/util/status_util.go lines 77-91).
STATE_ORDER = ("Killed", "Failed", "Succeeded", "EarlyStopped", "Running", "MetricsUnavailable")
FINISHED = {"Killed", "Failed", "Succeeded", "EarlyStopped", "MetricsUnavailable"}  # Trial.IsCompleted
LOG_SPAN = 100.0  # a parameter whose range spans 100x or more gets a logarithmic axis


class ReportError(Exception):
    """Bad input: the message names what is wrong; exit status 2."""


# ---- reading kubectl's JSON -------------------------------------------------------------------------------------


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name", "?")) if isinstance(meta, dict) else "?"


def _describe(obj: Any) -> str:
    return f"{obj.get('kind', '?')}/{_name(obj)}" if isinstance(obj, dict) else type(obj).__name__


def read_objects(paths: list[str], stdin: TextIO) -> list[dict[str, Any]]:
    """Every object of the inputs, Lists (``kubectl get a,b -o json``, ``TrialList``) flattened."""
    if paths.count("-") > 1:
        raise ReportError("'-' (standard input) can be given once")
    objects: list[dict[str, Any]] = []
    for path in paths:
        where = "standard input" if path == "-" else path
        try:
            text = stdin.read() if path == "-" else Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(f"{where}: cannot read ({exc})") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ReportError(f"{where}: not JSON ({exc}); expected `kubectl get ... -o json` output") from None
        items = doc.get("items") if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") else [doc]
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise ReportError(f"{where}: expected a Kubernetes object or a List of objects, got {_describe(doc)}")
        objects += items
    return objects


def _of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind and o.get("apiVersion") == API_VERSION]


def _field(obj: dict[str, Any], path: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """``obj[a][b]...`` for ``path`` "a.b...": the default when absent, an error naming the field when mistyped."""
    value: Any = obj
    walked: list[str] = []
    for key in path.split("."):
        if not isinstance(value, dict):
            raise ReportError(f"{_describe(obj)}: {'.'.join(walked)} should be an object, got {type(value).__name__}")
        if value.get(key) is None:
            return default
        value = value[key]
        walked.append(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ReportError(f"{_describe(obj)}: {path} should be {expected}, got {type(value).__name__}")
    return value


def _pairs(obj: dict[str, Any], path: str, key: str = "name") -> list[dict[str, Any]]:
    items = _field(obj, path, list, [])
    if not all(isinstance(item, dict) and isinstance(item.get(key), str) for item in items):
        raise ReportError(f"{_describe(obj)}: {path} should be a list of objects with a '{key}'")
    return items


# ---- the model of a report --------------------------------------------------------------------------------------


@dataclass
class Parameter:
    name: str
    type: str
    feasible: dict[str, Any]

    def log_axis(self, values: list[float]) -> bool:
        """Logarithmic for logUniform (and logNormal) parameters and for positive ranges spanning 100x or more."""
        if self.feasible.get("distribution") in ("logUniform", "logNormal"):
            return True
        try:
            low, high = float(self.feasible["min"]), float(self.feasible["max"])
        except (KeyError, TypeError, ValueError):
            low, high = (min(values), max(values)) if values else (0.0, 0.0)
        return low > 0 and high / low >= LOG_SPAN

    @property
    def numeric(self) -> bool:
        return self.type in ("double", "int") or (self.type == "discrete" and _all_numbers(self.feasible.get("list")))


def _all_numbers(values: Any) -> bool:
    return isinstance(values, list) and bool(values) and all(_number(v) is not None for v in values)


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass
class TrialRow:
    name: str
    state: str
    assignments: dict[str, str]
    metrics: dict[str, str]  # name -> the value Katib's strategy picks ('unavailable' when none)
    objective: float | None
    best: bool = False


@dataclass
class Report:
    experiment: dict[str, Any]
    objective: str
    goal_type: str
    strategies: dict[str, str]
    metric_names: list[str]
    parameters: list[Parameter]
    rows: list[TrialRow] = field(default_factory=list)

    @property
    def name(self) -> str:
        return _name(self.experiment)


def pick_experiment(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    experiments = _of_kind(objects, "Experiment")
    if name:
        chosen = [e for e in experiments if _name(e) == name]
        if not chosen:
            found = ", ".join(_name(e) for e in experiments) or "none"
            raise ReportError(f"--experiment {name}: not in the input (experiments there: {found})")
        return chosen[0]
    if len(experiments) == 1:
        return experiments[0]
    if not experiments:
        found = ", ".join(_describe(o) for o in objects[:5]) or "nothing"
        raise ReportError(
            f"no Experiment ({API_VERSION}) in the input, found {found}; expected "
            "`kubectl get experiment NAME -o json` (and the trials)"
        )
    names = ", ".join(_name(e) for e in experiments)
    raise ReportError(f"{len(experiments)} experiments in the input ({names}): choose one with --experiment")


def trials_of(objects: list[dict[str, Any]], experiment: str) -> list[dict[str, Any]]:
    """The experiment's trials; trials of an experiment that is in the input too are left to it, others refused."""
    present = {_name(e) for e in _of_kind(objects, "Experiment")}
    kept = []
    for trial in _of_kind(objects, "Trial"):
        labels = _field(trial, "metadata.labels", dict, {})
        owner = labels.get(EXPERIMENT_LABEL)
        if owner is None:
            owners = _field(trial, "metadata.ownerReferences", list, [])
            owner = next((o.get("name") for o in owners if isinstance(o, dict) and o.get("kind") == "Experiment"), None)
        if owner == experiment:
            kept.append(trial)
        elif owner not in present:
            raise ReportError(
                f"trial {_name(trial)} belongs to experiment {owner or '(none named)'}, not {experiment}: "
                f"list the trials with -l {EXPERIMENT_LABEL}={experiment}"
            )
    katib = ("Experiment", "Trial", "Suggestion")  # a Suggestion (kubectl get experiment,trials,suggestions) is skipped
    others = [o for o in objects if o.get("kind") not in katib or o.get("apiVersion") != API_VERSION]
    if others:
        raise ReportError(f"not a Katib Experiment or Trial: {', '.join(_describe(o) for o in others[:5])}")
    return kept


def trial_state(trial: dict[str, Any]) -> str:
    """The trial's state as Katib's experiment status counts it; Pending when no condition is true yet."""
    true = {c.get("type") for c in _pairs(trial, "status.conditions", "type") if c.get("status") == "True"}
    return next((state for state in STATE_ORDER if state in true), "Pending")


def metric_value(metric: dict[str, Any], strategy: str) -> str:
    """The value Katib takes for a metric (status_util.go getObjectiveMetricValue): min or max, else latest."""
    picked = metric.get(strategy) if strategy in ("min", "max") else None
    if picked is None or picked == UNAVAILABLE:
        picked = metric.get("latest")
    return UNAVAILABLE if picked is None else str(picked)


def objective_spec(experiment: dict[str, Any]) -> tuple[str, str, dict[str, str], list[str]]:
    """(objective metric, minimize|maximize, strategy per metric, metric names in order)."""
    objective = _field(experiment, "spec.objective", dict, None)
    if objective is None or not isinstance(objective.get("objectiveMetricName"), str):
        raise ReportError(f"experiment {_name(experiment)}: spec.objective.objectiveMetricName is missing")
    name, goal_type = objective["objectiveMetricName"], str(objective.get("type", "maximize"))
    additional = [m for m in _field(experiment, "spec.objective.additionalMetricNames", list, []) if m != name]
    # Katib's defaults (experiment_defaults.go setDefaultObjective, lines 49-95): every metric without a strategy
    # follows the objective's direction (min for minimize, max for maximize), latest otherwise.
    default = {"minimize": "min", "maximize": "max"}.get(goal_type, "latest")
    strategies = {m: default for m in [name, *additional]}
    for strategy in _pairs(experiment, "spec.objective.metricStrategies"):
        strategies[strategy["name"]] = str(strategy.get("value", default))
    return name, goal_type, strategies, [name, *additional]


def build_report(objects: list[dict[str, Any]], experiment_name: str = "") -> Report:
    experiment = pick_experiment(objects, experiment_name)
    objective, goal_type, strategies, names = objective_spec(experiment)
    parameters = [
        Parameter(p["name"], str(p.get("parameterType", "")), _field(p, "feasibleSpace", dict, {}))
        for p in _pairs(experiment, "spec.parameters")
    ]
    report = Report(experiment, objective, goal_type, strategies, names, parameters)
    trials = trials_of(objects, _name(experiment))
    for trial in trials:
        observed = {m["name"]: m for m in _pairs(trial, "status.observation.metrics")}
        for extra in sorted(set(observed) - set(report.metric_names)):
            report.metric_names.append(extra)
        metrics = {m: metric_value(observed[m], strategies.get(m, "latest")) for m in observed}
        assignments = {a["name"]: str(a.get("value", "")) for a in _pairs(trial, "spec.parameterAssignments")}
        report.rows.append(
            TrialRow(_name(trial), trial_state(trial), assignments, metrics, _number(metrics.get(objective)))
        )
    finished = [r for r in report.rows if r.state in FINISHED]
    if not finished:
        states = ", ".join(f"{r.name} {r.state}" for r in report.rows) or "no trials in the input"
        raise ReportError(f"experiment {report.name} has no finished trial ({states}); report when it has succeeded")
    if all(r.objective is None for r in finished):
        seen = ", ".join(f"{r.name} {r.state} {objective}={r.metrics.get(objective, '(none)')}" for r in finished)
        raise ReportError(
            f"experiment {report.name}: no finished trial has a value of the objective {objective} ({seen}): Katib "
            f"records '{UNAVAILABLE}' when its collector finds no `{objective}=` line in the training output "
            "(docs/training.md, 'Katib metric lines')"
        )
    sign = -1.0 if goal_type == "maximize" else 1.0
    report.rows.sort(key=lambda r: (r.objective is None, sign * (r.objective or 0.0), r.name))
    report.rows[0].best = True
    return report


# ---- writing ----------------------------------------------------------------------------------------------------


def table(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["best", "trial", "status", *(p.name for p in report.parameters)]
    header += [f"{m} ({report.strategies.get(m, 'latest')})" for m in report.metric_names]
    rows = [
        ["yes" if r.best else "", r.name, r.state, *(r.assignments.get(p.name, "") for p in report.parameters)]
        + [r.metrics.get(m, "") for m in report.metric_names]
        for r in report.rows
    ]
    return header, rows


def _condition(experiment: dict[str, Any]) -> str:
    true = [c.get("type") for c in _pairs(experiment, "status.conditions", "type") if c.get("status") == "True"]
    return str(true[-1]) if true else "unknown"


def markdown(report: Report, plots: list[Path]) -> str:
    exp = report.experiment
    goal = _field(exp, "spec.objective.goal", (int, float), None)
    states = ", ".join(f"{n} {s}" for s, n in _count_states(report.rows))
    lines = [
        f"# Katib experiment {report.name}",
        "",
        f"- status: {_condition(exp)}; trials: {len(report.rows)} ({states})",
        f"- objective: {report.goal_type} {report.objective}"
        + ("" if goal is None else f" (goal {goal})")
        + f"; algorithm: {_field(exp, 'spec.algorithm.algorithmName', str, '?')}",
        "",
        "## Current optimal trial (Katib)",
        "",
    ]
    optimal = _field(exp, "status.currentOptimalTrial", dict, {})
    best_name = optimal.get("bestTrialName") or ""
    if best_name:
        assignments = _pairs(exp, "status.currentOptimalTrial.parameterAssignments")
        assigned = ", ".join(f"{a['name']}={a.get('value', '')}" for a in assignments)
        observed = "; ".join(
            f"{m['name']} min {m.get('min', '?')} max {m.get('max', '?')} latest {m.get('latest', '?')}"
            for m in _pairs(exp, "status.currentOptimalTrial.observation.metrics")
        )
        lines += [f"- trial: {best_name}", f"- parameters: {assigned or '(none)'}"]
        lines += [f"- observation: {observed or '(none)'}"]
        ours = report.rows[0].name
        if ours != best_name:
            lines.append(
                f"- note: the best trial of the table below is {ours} (Katib updates its optimum as trials end)"
            )
    else:
        lines.append("- none reported")
    header, rows = table(report)
    lines += ["", "## Trials, best first", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    if plots:
        lines += ["", "Plots: " + ", ".join(f"[{p.name}]({p.name})" for p in plots)]
    return "\n".join(lines) + "\n"


def _count_states(rows: list[TrialRow]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    return sorted(counts.items())


def write_csv(report: Report, path: Path) -> Path:
    header, rows = table(report)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buffer.getvalue())
    return path


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "parameter"


def plot_parameter(report: Report, parameter: Parameter, out: Path) -> Path | None:
    """The objective against one parameter's values (trials with both); None when there is nothing to draw."""
    points = [
        (r.assignments[parameter.name], r.objective, r.best)
        for r in report.rows
        if r.objective is not None and parameter.name in r.assignments
    ]
    if parameter.numeric:
        points = [(x, y, b) for x, y, b in points if _number(x) is not None]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    strategy = report.strategies.get(report.objective, "latest")
    ax.set_title(f"{report.objective} against {parameter.name} ({len(points)} trials)")
    ax.set_ylabel(f"{report.objective} ({strategy} over the trial)")
    ax.grid(True, alpha=0.3)
    if parameter.numeric:
        xs = [float(x) for x, _, _ in points]
        log_x = parameter.log_axis(xs) and min(xs) > 0
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(parameter.name + (" (log scale)" if log_x else ""))
    else:
        listed = [str(v) for v in parameter.feasible.get("list") or []]  # the search space's order first
        categories = listed + sorted({x for x, _, _ in points} - set(listed))
        xs = [float(categories.index(x)) for x, _, _ in points]
        ax.set_xticks(range(len(categories)), categories)
        ax.set_xlim(-0.5, len(categories) - 0.5)
        ax.set_xlabel(parameter.name)
    others = [(x, y) for x, (_, y, b) in zip(xs, points, strict=True) if not b]
    best = [(x, y) for x, (_, y, b) in zip(xs, points, strict=True) if b]
    if others:
        ax.scatter([x for x, _ in others], [y for _, y in others], marker="o", label="trial")
    if best:
        ax.scatter([best[0][0]], [best[0][1]], marker="*", s=250, color="tab:red", label="best trial", zorder=3)
    ax.legend(fontsize=8)
    return _save(fig, out / f"{_file_name(parameter.name)}.png")


def write_report(report: Report, out: Path, with_csv: bool) -> tuple[str, list[Path]]:
    out.mkdir(parents=True, exist_ok=True)
    plots = [p for p in (plot_parameter(report, parameter, out) for parameter in report.parameters) if p]
    text = markdown(report, plots)
    (out / "report.md").write_text(text)
    written = [out / "report.md", *plots]
    if with_csv:
        written.append(write_csv(report, out / "trials.csv"))
    return text, written


# ---- command line -----------------------------------------------------------------------------------------------


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dinops hpo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", metavar="report", required=True)
    report = commands.add_parser(
        "report", help="tables and plots of a finished Katib Experiment and its Trials", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    report.add_argument(
        "inputs", nargs="+", metavar="JSON", help="`kubectl get ... -o json` output: files, or - for standard input"
    )
    report.add_argument("--experiment", default="", help="the Experiment to report when the input holds several")
    report.add_argument("--out", default="hpo-report", help="folder for report.md, the plots and trials.csv")
    report.add_argument("--csv", action="store_true", help="also write the trials table as trials.csv")
    return parser


def main(argv: list[str] | None = None, stdin: TextIO | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = get_args_parser().parse_args(argv)
    try:
        report = build_report(read_objects(args.inputs, stdin or sys.stdin), args.experiment)
        text, written = write_report(report, Path(args.out), args.csv)
    except ReportError as exc:
        log.error("dinops hpo report: %s", exc)
        return 2
    except OSError as exc:
        log.error("dinops hpo report: --out %s: cannot write (%s)", args.out, exc)
        return 2
    sys.stdout.write(text)
    log.info("wrote %s", ", ".join(str(p) for p in written))
    return 0
