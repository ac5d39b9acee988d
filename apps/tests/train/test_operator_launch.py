"""`dinops train` launched as the Kubeflow operators launch it, and read back as Katib reads it.

Two "nodes" are two `torchrun -m dinops.train.main` processes (one gloo CPU worker each, rendezvous on 127.0.0.1)
whose environment holds exactly what the operator injects and nothing else distributed:

- TrainJob, Kubeflow Trainer v2.3.0 torch plugin: ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
  ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` (kubeflow/trainer@v2.3.0:pkg/runtime/framework/plugins/torch/torch.go,
  lines 145-176);
- PyTorchJob with a Master replica, Training Operator v1.9.4: the same ``PET_*`` plus ``PYTHONUNBUFFERED``,
  ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` = replicas x nprocPerNode (1 when not an integer) and
  ``RANK`` = ``PET_NODE_RANK`` = replica index (kubeflow/trainer@v1.9.4:pkg/controller.v1/pytorch/envvar.go,
  lines 43-126).

The launch is the manifests' container command, ``tini -- torchrun --shutdown-timeout 280 -m dinops.train.main``
(``python -m torch.distributed.run`` is the same program as the ``torchrun`` script; tini only forwards signals).
Each node's stdout and stderr go to one file, as Katib's StdOut collector wraps the command with ``1>file 2>&1``
(kubeflow/katib@v0.19.0:pkg/webhook/v1beta1/pod/utils.go, lines 173-176).
"""

from __future__ import annotations

import calendar
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from dinops.train import checkpoints
from dinops.train.dist import launch_problem
from dinops.train.logs import metric_line

from .conftest import TINY_MODEL, tiny_train_args
from .test_train_runs import _assert_same_weights, _train_cmd

# The flags the manifests add to torchrun (docs/training.md): the workers get 280 s after SIGTERM (the pod's
# terminationGracePeriodSeconds is 300) to finish their step and write the checkpoint, instead of torch's 30 s.
TORCHRUN_FLAGS = ("--shutdown-timeout", "280")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
KINDS = ("trainjob", "pytorchjob")
# The Experiment's metrics, objective first, as the collector gets them (main.go: -m "bbox_ap;bbox_ap50;...").
KATIB_METRICS = ("bbox_ap", "bbox_ap50", "bbox_ap75", "loss", "epoch")

# One input size, no denoising queries (their noise is drawn per process): two processes at batch 1 then train
# on the same images as one at batch 2 (see test_ddp_two_gloo_processes_and_accumulation_equal_one_process), and
# 96 px keeps the 1x1 top level of GroupNorm away at batch 1 in evaluation too.
SAME = ["--train-scales", "96", "--crop-scales", "96", "--crop-size", "96,96", "--max-size", "96", "--eval-size", "96"]
SAME += ["--model-overrides", TINY_MODEL + ",use_dn=false"]
# Two epochs of 8 steps, evaluated after each, the latest checkpoint every 3 steps (global steps 3, 6, 9, 12, 15).
RUN = [*SAME, "--epochs", "2", "--eval-every", "1", "--checkpoint-steps", "3"]
# Rank 0 logs it after writing a checkpoint.
CHECKPOINT_LINE = r"checkpoint: epoch {epoch} step {step} "


# ---- the operators' environments --------------------------------------------------------------------------------

_DISTRIBUTED = re.compile(
    r"(RANK|WORLD_SIZE|(GROUP|ROLE)_(RANK|WORLD_SIZE|NAME)|(LOCAL|MASTER|PET|TORCHELASTIC|DINO)_\w+)"
)


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _DISTRIBUTED.fullmatch(k)}
    env["OMP_NUM_THREADS"] = "1"  # the same thread count in every run keeps CPU results comparable
    return env


def trainjob_env(node: int, nnodes: int, port: int, nproc: str = "1") -> dict[str, str]:
    """What Trainer v2.3.0 injects: PET_* only (master is pod node-0-0 of the JobSet, port 29500 there)."""
    return {
        "PET_NNODES": str(nnodes),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }


def pytorchjob_env(node: int, nnodes: int, port: int, nproc: str = "1") -> dict[str, str]:
    """What Training Operator v1.9.4 injects with a Master replica (master-0 has rank 0, worker-i rank i+1)."""
    per_node = int(nproc) if nproc.isdigit() else 1  # envvar.go getNprocPerNodeInt: 1 unless an integer
    return {
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
        "WORLD_SIZE": str(nnodes * per_node),
        "RANK": str(node),
        "PET_NODE_RANK": str(node),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NNODES": str(nnodes),
    }


OPERATOR_ENV = {"trainjob": trainjob_env, "pytorchjob": pytorchjob_env}


# ---- nodes: processes started and killed as a pod's container is ---------------------------------------------


@dataclass
class Node:
    proc: subprocess.Popen
    log: Path  # stdout and stderr together, as Katib's `1>file 2>&1`

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (torchrun starts its workers in their own sessions)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def _kill_pod(node: Node) -> None:
    """SIGKILL to every process of the node at once, as the kubelet kills a container (or a node dies)."""
    for pid in _descendants(node.proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    node.proc.wait(30)


def start_node(kind, node, nnodes, port, args, log: Path, flags=TORCHRUN_FLAGS, nproc="1", env=None, **popen) -> Node:
    """One node: torchrun in exactly the operator's environment, stdout and stderr into ``log``."""
    env = _base_env() | OPERATOR_ENV[kind](node, nnodes, port, nproc) | (env or {})
    with open(log, "w") as fh:
        cmd = [*TORCHRUN, *flags, "-m", "dinops.train.main", *args]
        return Node(subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, **popen), log)


@pytest.fixture
def launcher(tmp_path):
    """Start nodes (logs in tmp_path); whatever still runs at the end of the test is killed with its workers."""
    started: list[Node] = []

    def start(kind, node, nnodes, port, args, name, **options) -> Node:
        started.append(start_node(kind, node, nnodes, port, args, tmp_path / f"{name}.log", **options))
        return started[-1]

    yield start
    for node in started:
        if node.proc.poll() is None:
            _kill_pod(node)


def _finish(nodes: list[Node], timeout: float = 240) -> None:
    for node in nodes:
        node.proc.wait(timeout)
    for node in nodes:
        assert node.proc.returncode == 0, f"{node.log.name}: rc {node.proc.returncode}\n{node.output()[-3000:]}"


def _two_nodes(start, kind: str, args: list[str], name: str) -> list[Node]:
    port = _free_port()
    return [start(kind, rank, 2, port, args, f"{name}-node{rank}") for rank in (0, 1)]


def _wait_for(nodes: list[Node], path: Path, pattern: str, timeout: float = 180) -> None:
    regex = re.compile(pattern)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and regex.search(path.read_text()):
            return
        for node in nodes:
            if node.proc.poll() is not None:
                raise AssertionError(f"{node.log.name} ended (rc {node.proc.returncode}):\n{node.output()[-3000:]}")
        time.sleep(0.02)
    raise AssertionError(f"{pattern!r} did not appear in {path} within {timeout} s")


# ---- runs shared by the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_process(train_synth, tmp_path_factory):
    """The single-process run the two-node runs must equal: batch 2 = 2 nodes x batch 1. Returns (dir, output)."""
    out = tmp_path_factory.mktemp("one-process")
    done = subprocess.run(
        _train_cmd(tiny_train_args(train_synth, out, *RUN)),
        env=_base_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, as Katib's wrapper writes it
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return out, done.stdout


@pytest.fixture(scope="module", params=KINDS)
def two_nodes(request, train_synth, tmp_path_factory):
    """An uninterrupted two-node run under each operator's environment. Returns (kind, dir, [node outputs])."""
    kind = request.param
    out = tmp_path_factory.mktemp(f"two-nodes-{kind}")
    port, nodes = _free_port(), []
    try:
        for rank in (0, 1):
            args = tiny_train_args(train_synth, out, *RUN, "--batch-size", "1")
            nodes.append(start_node(kind, rank, 2, port, args, out.parent / f"{out.name}-node{rank}.log"))
        _finish(nodes)
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                _kill_pod(node)
    return kind, out, [node.output() for node in nodes]


# ---- 1. the same training as one process ------------------------------------------------------------------------


def test_two_nodes_train_as_one_process(two_nodes, one_process):
    kind, out, outputs = two_nodes
    config = json.loads((out / "config.json").read_text())
    assert config["world_size"] == 2 and config["global_batch"] == 2
    assert "process 0 of 2 (local 0), backend gloo" in outputs[0]
    final = checkpoints.load(out / checkpoints.LATEST)
    assert final["global_step"] == 16 and final["next"] == {"epoch": 2, "step": 0}
    # Adam turns float-rounding differences of near-zero gradients into up to a fraction of a step (lr 2e-4):
    # the tolerances of test_ddp_two_gloo_processes_and_accumulation_equal_one_process.
    _assert_same_weights(one_process[0] / checkpoints.LATEST, out / checkpoints.LATEST, rtol=1e-3, atol=1e-4)


def test_pytorchjob_world_size_is_torchruns_not_the_operators(launcher, train_synth, tmp_path):
    """nprocPerNode "auto": the operator injects WORLD_SIZE=1 (replicas x 1), torchrun starts one worker per CPU."""
    cpus = sorted(os.sched_getaffinity(0))[:2]  # a node with two CPUs (torchrun's "auto" counts the affinity)
    args = tiny_train_args(train_synth, tmp_path / "out", *SAME, "--epochs", "1", "--max-steps", "2")
    args += ["--eval-every", "0", "--batch-size", "1"]
    node = launcher(
        "pytorchjob", 0, 1, _free_port(), args, "auto", nproc="auto",
        env={"CUDA_VISIBLE_DEVICES": ""}, preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )  # fmt: skip
    assert pytorchjob_env(0, 1, 1, "auto")["WORLD_SIZE"] == "1"
    _finish([node])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["world_size"] == len(cpus) and config["global_batch"] == len(cpus)
    assert f"process 0 of {len(cpus)} (local 0)" in node.output()


# ---- 2. a node killed, then both restarted with --resume auto ---------------------------------------------------


def test_a_killed_node_ends_the_other_and_both_resume(two_nodes, launcher, train_synth, tmp_path):
    """TrainJob: the worker node is killed; PyTorchJob: the master (rank 0, and the rendezvous store's host)."""
    kind, uninterrupted, _ = two_nodes
    killed = {"trainjob": 1, "pytorchjob": 0}[kind]
    args = tiny_train_args(train_synth, tmp_path, *RUN, "--batch-size", "1", "--resume", "auto")
    nodes = _two_nodes(launcher, kind, args, "first")
    _wait_for(nodes, tmp_path / "console.log", CHECKPOINT_LINE.format(epoch=1, step=1))  # global step 9
    _kill_pod(nodes[killed])
    survivor = nodes[1 - killed]
    began = time.time()
    survivor.proc.wait(60)  # the survivor's worker loses its peer in the next collective: it fails, torchrun ends
    assert survivor.proc.returncode == 1, survivor.output()[-3000:]
    assert time.time() - began < 60
    at_kill = checkpoints.load(tmp_path / checkpoints.LATEST)["next"]
    assert at_kill["epoch"] == 1 and at_kill["step"] in (1, 4), at_kill  # after an evaluation, mid-epoch

    _finish(_two_nodes(launcher, kind, args, "resumed"))
    console = (tmp_path / "console.log").read_text()
    assert re.search(rf"resumed from .*checkpoint.pth at epoch 1 step {at_kill['step']}\n", console)
    final = checkpoints.load(tmp_path / checkpoints.LATEST)
    assert final["global_step"] == 16 and final["next"] == {"epoch": 2, "step": 0}
    # the tolerance of test_sigkill_mid_epoch_then_resume_equals_uninterrupted (one process killed and resumed)
    _assert_same_weights(uninterrupted / checkpoints.LATEST, tmp_path / checkpoints.LATEST, rtol=1e-5, atol=1e-6)


# ---- 3. SIGTERM to torchrun (the pod's eviction or deletion) ----------------------------------------------------


def test_sigterm_to_torchrun_checkpoints_then_exits_1(launcher, train_synth, tmp_path):
    """The kubelet's SIGTERM reaches torchrun through tini; torchrun forwards it to its worker.

    One node signalled (an eviction): its worker finishes the step, every process stops at that step
    (dist.any_process), rank 0 on the other node writes the checkpoint, the workers exit 143. torchrun exits 1 on
    both nodes: the signalled one re-raises its SignalException, the other reports its worker's exit 143 as failed.
    """
    args = tiny_train_args(train_synth, tmp_path, *SAME, "--batch-size", "1", "--epochs", "50")
    nodes = _two_nodes(launcher, "trainjob", [*args, "--eval-every", "0", "--checkpoint-steps", "0"], "sigterm")
    _wait_for(nodes, tmp_path / "console.log", r"Epoch: \[0\]\s+\[2/8\]")
    assert not (tmp_path / checkpoints.LATEST).exists()
    nodes[1].proc.send_signal(signal.SIGTERM)
    for node in nodes:
        node.proc.wait(120)
    signalled, other = nodes[1].output(), nodes[0].output()
    assert re.search(r"Received (15|\S*SIGTERM) death signal, shutting down workers", signalled)
    assert "received SIGTERM: finishing this step" in signalled  # the worker of node 1, told by its torchrun
    assert re.search(r"stopped at epoch 0 step \d+; `--resume auto` continues from here", other)  # rank 0
    assert "failed (exitcode: 143)" in other  # node 0's worker stopped with the others and exited 143
    assert [node.proc.returncode for node in nodes] == [1, 1], (signalled[-2000:], other[-2000:])
    ckpt = checkpoints.load(tmp_path / checkpoints.LATEST)
    assert ckpt["next"]["epoch"] == 0 and ckpt["next"]["step"] >= 3
    assert "forcefully exiting via" not in signalled + other  # nobody was SIGKILLed


def test_the_shutdown_timeout_bounds_the_checkpoint(launcher, train_synth, tmp_path):
    """torchrun SIGKILLs a worker still running ``--shutdown-timeout`` seconds after forwarding SIGTERM (default 30).

    With 0 the worker never gets to write its checkpoint: a checkpoint longer than the timeout is lost the same way.
    """
    args = tiny_train_args(
        train_synth, tmp_path, *SAME, "--epochs", "50", "--eval-every", "0", "--checkpoint-steps", "0"
    )
    node = launcher("trainjob", 0, 1, _free_port(), args, "timeout0", flags=("--shutdown-timeout", "0"))
    _wait_for([node], tmp_path / "console.log", r"Epoch: \[0\]\s+\[2/8\]")
    node.proc.send_signal(signal.SIGTERM)
    node.proc.wait(60)
    assert node.proc.returncode == 1
    assert re.search(r"forcefully exiting via \S*(SIGKILL|9)\b", node.output())
    assert not (tmp_path / checkpoints.LATEST).exists()


def test_a_bad_setting_under_torchrun_exits_1_not_2(launcher, train_synth, tmp_path):
    """torchrun turns every failed worker into its own exit status 1: a Job's onExitCodes [2] rule never matches."""
    node = launcher("trainjob", 0, 1, _free_port(), tiny_train_args(train_synth, tmp_path, "--epochs", "0"), "bad")
    node.proc.wait(60)
    assert node.proc.returncode == 1
    assert "--epochs must be >= 1" in node.output() and "failed (exitcode: 2)" in node.output()


# ---- 4. started without torchrun: refused ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (trainjob_env(1, 2, 29500), "PET_NNODES=2 (a Kubeflow TrainJob) without RANK/WORLD_SIZE"),
        (trainjob_env(0, 1, 29500, nproc="4"), "PET_NPROC_PER_NODE=4: the operator expects 4 processes"),
        (pytorchjob_env(1, 2, 23456, nproc="2"), "PET_NPROC_PER_NODE=2: the operator expects 2 processes"),
        (trainjob_env(0, 1, 29500), None),  # one node, one process: trains alone, as asked
        (pytorchjob_env(1, 2, 23456), None),  # RANK/WORLD_SIZE/MASTER_* describe one process per pod: env://
        (pytorchjob_env(1, 2, 23456, nproc="auto"), None),
        ({"PET_NNODES": "2", "TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2"}, None),  # a torchrun worker
        ({}, None),
    ],
)
def test_launch_problem(env, message):
    problem = launch_problem(env)
    assert (problem is None) if message is None else (message in problem and "torchrun -m dinops.train.main" in problem)


def test_train_without_torchrun_in_a_trainjob_pod_exits_2(train_synth, tmp_path, monkeypatch, caplog, no_dino_env):
    from dinops.train.main import main as train_main

    for name in [k for k in os.environ if _DISTRIBUTED.fullmatch(k)]:
        monkeypatch.delenv(name)
    for name, value in trainjob_env(0, 2, 29500).items():
        monkeypatch.setenv(name, value)
    assert train_main(tiny_train_args(train_synth, tmp_path)) == 2
    assert "would train alone, one independent copy per node" in caplog.text


# ---- 5. Katib's StdOut collector, re-implemented -----------------------------------------------------------------
# kubeflow/katib@v0.19.0 (Go 1.24, go.mod), file pkg/metricscollector/v1beta1/file-metricscollector/
# file-metricscollector.go (FMC below) and cmd/metricscollector/v1beta1/file-metricscollector/main.go (MAIN).

# pkg/metricscollector/v1beta1/common/const.go line 47, verbatim.
KATIB_DEFAULT_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
# The same in Python: RE2's \s is [\t\n\f\r ] (no \v), its \w and \d are ASCII
# (https://github.com/google/re2/wiki/Syntax). Leftmost-first matching, as Python's.
KATIB_FILTER = re.compile(KATIB_DEFAULT_FILTER.replace(r"\s", r"[\t\n\f\r ]"), re.ASCII)
ZERO_TIME = "0001-01-01T00:00:00Z"  # FMC line 89: time.Time{}.UTC().Format(time.RFC3339)
UNAVAILABLE = "unavailable"  # pkg/controller.v1beta1/consts/const.go line 155


def _days_in(month: int, year: int) -> int:
    return 29 if month == 2 and (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)) else (
        [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    )  # fmt: skip


def _unix_nanos(year, month, day, hour, minute, sec, nsec, offset_s) -> int:
    """Nanoseconds since 1970 of a proleptic Gregorian date and time (year 0 included, as Go's Date)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    return ((days * 86400 + hour * 3600 + minute * 60 + sec) - offset_s) * 10**9 + nsec


def _nanoseconds(value: bytes, nbytes: int) -> int:
    """Go src/time/format.go parseNanoseconds: at most 9 digits after the separator, scaled to nanoseconds."""
    nbytes = min(nbytes, 10)
    return int(value[1:nbytes]) * 10 ** (10 - nbytes)


def _go_parse_rfc3339_fast(s: bytes) -> int | None:
    """Go 1.24 src/time/format_rfc3339.go parseRFC3339 (Parse's fast path for RFC3339 and RFC3339Nano)."""
    ok = True

    def uint(part: bytes, lo: int, hi: int) -> int:
        nonlocal ok
        if not re.fullmatch(rb"[0-9]*", part) or not lo <= int(part or b"0") <= hi:
            ok = False
            return lo
        return int(part or b"0")

    if len(s) < len(b"2006-01-02T15:04:05"):
        return None
    year, month = uint(s[0:4], 0, 9999), uint(s[5:7], 1, 12)
    day = uint(s[8:10], 1, _days_in(month, year))
    hour, minute, sec = uint(s[11:13], 0, 23), uint(s[14:16], 0, 59), uint(s[17:19], 0, 59)
    if not ok or s[4:5] + s[7:8] + s[10:11] + s[13:14] + s[16:17] != b"--T::":
        return None
    s, nsec = s[19:], 0
    if len(s) >= 2 and s[0:1] == b"." and s[1:2].isdigit():
        n = 2
        while n < len(s) and s[n : n + 1].isdigit():
            n += 1
        nsec, s = _nanoseconds(s, n), s[n:]
    offset = 0
    if s != b"Z":
        if len(s) != len(b"-07:00"):
            return None
        hr, mm = uint(s[1:3], 0, 23), uint(s[4:6], 0, 59)
        if not ok or s[0:1] not in (b"-", b"+") or s[3:4] != b":":
            return None
        offset = (hr * 60 + mm) * 60 * (-1 if s[0:1] == b"-" else 1)
    return _unix_nanos(year, month, day, hour, minute, sec, nsec, offset)


def _go_parse_rfc3339nano_layout(v: bytes) -> int | None:
    """Go 1.24 src/time/format.go parse() with the layout "2006-01-02T15:04:05.999999999Z07:00" (the fallback).

    Its chunks: stdLongYear, "-", stdZeroMonth, "-", stdZeroDay, "T", stdHour (getnum not fixed: one or two
    digits), ":", stdZeroMinute, ":", stdZeroSecond, stdFracSecond9 (optional, '.' or ',' then any digits),
    stdISO8601ColonTZ ('Z' or sign hh:mm, range tests hh > 24 and mm > 60); then no extra text; then the day range.
    """

    def getnum(value: bytes, fixed: bool) -> tuple[int, bytes] | None:
        if not value[:1].isdigit():
            return None
        if not value[1:2].isdigit():
            return None if fixed else (int(value[:1]), value[1:])
        return int(value[:2]), value[2:]

    def literal(value: bytes, text: bytes) -> bytes | None:
        return value[len(text) :] if value.startswith(text) else None

    if len(v) < 4 or not v[:1].isdigit() or not v[:4].isdigit():
        return None
    year, v = int(v[:4]), v[4:]
    fields = []
    for sep, fixed, lo, hi in ((b"-", True, 1, 12), (b"-", True, 0, 99), (b"T", False, 0, 23), (b":", True, 0, 59),
                               (b":", True, 0, 59)):  # fmt: skip
        rest = literal(v, sep)
        got = getnum(rest, fixed) if rest is not None else None
        if got is None or not lo <= got[0] <= hi:
            return None
        fields.append(got[0])
        v = got[1]
    month, day, hour, minute, sec = fields
    nsec = 0
    if len(v) >= 2 and v[:1] in (b".", b",") and v[1:2].isdigit():
        i = 0
        while i + 1 < len(v) and v[i + 1 : i + 2].isdigit():
            i += 1
        nsec, v = _nanoseconds(v, 1 + i), v[1 + i :]
    if v[:1] == b"Z":
        offset, v = 0, v[1:]
    else:
        if len(v) < 6 or v[3:4] != b":":
            return None
        sign, hh, mm, v = v[:1], v[1:3], v[4:6], v[6:]
        if not (hh.isdigit() and len(hh) == 2 and mm.isdigit() and len(mm) == 2):
            return None
        if int(hh) > 24 or int(mm) > 60 or sign not in (b"+", b"-"):
            return None
        offset = (int(hh) * 60 + int(mm)) * 60 * (-1 if sign == b"-" else 1)
    if v or not 1 <= day <= _days_in(month, year):
        return None
    return _unix_nanos(year, month, day, hour, minute, sec, nsec, offset)


def go_parse_rfc3339nano(token: str) -> int | None:
    """``time.Parse(time.RFC3339Nano, token)`` (src/time/format.go Parse: the fast path, else the layout parser):
    Unix nanoseconds, or None where Go returns an error."""
    raw = token.encode("utf-8", "surrogateescape")
    fast = _go_parse_rfc3339_fast(raw)
    return fast if fast is not None else _go_parse_rfc3339nano_layout(raw)


def katib_text_observations(log: str, metrics: tuple[str, ...] = KATIB_METRICS) -> list[tuple[str, str, str]]:
    """FMC CollectObservationLog for the TEXT format with the default filter: (timestamp, name, value) in order."""
    found = []
    for line in log.split("\n"):  # FMC line 64: strings.Split(logs, "\n")
        if not any(m in line for m in metrics):  # FMC lines 77-87: substring test, before any regex
            continue
        timestamp = ZERO_TIME
        head, space, _ = line.partition(" ")  # FMC lines 89-99: strings.SplitN(logline, " ", 2)
        if space and go_parse_rfc3339nano(head) is not None:
            timestamp = head
        for match in KATIB_FILTER.finditer(line):  # FMC lines 101-123: every match; names compared exactly
            name, value = match[1].strip(), match[2].strip()
            if name in metrics:
                found.append((timestamp, name, value))
    if not any(name == metrics[0] for _, name, _ in found):  # FMC newObservationLog lines 169-196
        return [(ZERO_TIME, metrics[0], UNAVAILABLE)]
    return found


def katib_early_stopping_fatal_lines(log: str, rule_names: tuple[str, ...] = KATIB_METRICS) -> list[str]:
    """The lines on which MAIN watchMetricsFile (lines 185-216) would die: a line containing a rule's name whose
    matches (any name) include a value strconv.ParseFloat refuses ("" or a bare sign: klog.Fatalf)."""
    fatal = []
    for line in log.split("\n"):
        if any(rule in line for rule in rule_names):
            for match in KATIB_FILTER.finditer(line):
                try:
                    number = float(match[2].strip())
                except ValueError:
                    number = math.inf
                if math.isinf(number):  # ParseFloat: syntax error, or ErrRange beyond float64
                    fatal.append(line)
    return fatal


@pytest.mark.parametrize(
    ("token", "accepted"),
    [
        ("2026-11-24T09:00:00.123456Z", True),  # what dinops writes
        ("2026-11-24T09:00:00Z", True),
        ("2026-11-24T10:00:00.5+01:00", True),
        ("2026-11-24T09:00:00.1234567891Z", True),  # more than 9 digits: the rest ignored
        ("2026-11-24T09:00:00,5Z", True),  # the layout parser takes a comma too
        ("2026-11-24T9:00:00Z", True),  # ... and a one-digit hour (stdHour)
        ("2026-11-24T09:00:00+24:00", True),  # ... and a 24-hour offset (range test hh > 24)
        ("2026-11-24T09:00:00+25:00", False),
        ("2026-11-24T09:00:00", False),  # no zone
        ("2026-11-24 09:00:00Z", False),
        ("2026-11-24t09:00:00z", False),
        ("2026-02-29T09:00:00Z", False),
        ("2028-02-29T09:00:00Z", True),
        ("2026-11-24T24:00:00Z", False),
        ("2026-11-24T09:00:00.Z", False),
        ("[default0]:2026-11-24T09:00:00Z", False),  # a torchrun --tee prefix
        ("epoch=1", False),
    ],
)
def test_go_rfc3339nano_parse(token, accepted):
    assert (go_parse_rfc3339nano(token) is not None) is accepted


def test_go_rfc3339nano_instants():
    utc = go_parse_rfc3339nano("2026-11-24T09:00:00.123456Z")
    assert go_parse_rfc3339nano("2026-11-24T10:00:00.123456+01:00") == utc
    assert go_parse_rfc3339nano("2026-11-24T09:00:00.123456789Z") == utc + 789
    assert utc == calendar.timegm((2026, 11, 24, 9, 0, 0)) * 10**9 + 123_456_000


def _expected_observations(out: Path, output: str) -> list[tuple[str, str, str]]:
    """What training logged per epoch (log.txt), as Katib must read it, with the timestamps it printed."""
    records = [json.loads(line) for line in (out / "log.txt").read_text().splitlines()]
    stamps = [line.split(" ", 1)[0] for line in output.split("\n") if re.match(r"\S+Z epoch=", line)]
    assert len(stamps) == len(records) == 2
    expected = []
    for stamp, r in zip(stamps, records, strict=True):
        values = {"epoch": r["epoch"], "loss": r["train_loss"]}
        values |= dict(zip(("bbox_ap", "bbox_ap50", "bbox_ap75"), r["test_coco_eval_bbox"], strict=False))
        expected += [(stamp, name, repr(float(v)) if isinstance(v, float) else str(v)) for name, v in values.items()]
    return expected


def _check_katib_reading(out: Path, output: str) -> None:
    observed = katib_text_observations(output)
    # Exactly the printed metrics, nothing from any other line of the whole output (logs, torchrun, warnings).
    assert observed == _expected_observations(out, output)
    records = [json.loads(line) for line in (out / "log.txt").read_text().splitlines()]
    read = {(ts, name): value for ts, name, value in observed}
    stamps = sorted({ts for ts, _, _ in observed}, key=go_parse_rfc3339nano)
    for stamp, record in zip(stamps, records, strict=True):  # every value reads back as the float training had
        assert float(read[stamp, "bbox_ap"]) == record["test_coco_eval_bbox"][0]
        assert float(read[stamp, "bbox_ap75"]) == record["test_coco_eval_bbox"][2]
        assert float(read[stamp, "loss"]) == record["train_loss"] and int(read[stamp, "epoch"]) == record["epoch"]
    times = [go_parse_rfc3339nano(ts) for ts, name, _ in observed if name == "bbox_ap"]
    assert all(t is not None for t in times) and times == sorted(set(times)) and len(times) == 2  # increasing
    assert katib_early_stopping_fatal_lines(output) == []
    # `loss` and `epoch` appear in many other lines (console, checkpoint messages): none of them holds `=`.
    assert any("loss" in line and "bbox_ap" not in line for line in output.split("\n"))


def test_katib_reads_the_metrics_of_one_process(one_process):
    _check_katib_reading(*one_process)


def test_katib_reads_the_metrics_of_rank_0_only(two_nodes):
    _, out, outputs = two_nodes
    _check_katib_reading(out, outputs[0])  # node 0: the primary pod (TrainJob node index 0, PyTorchJob master)
    assert katib_text_observations(outputs[1]) == [(ZERO_TIME, "bbox_ap", UNAVAILABLE)]  # node 1 prints none


def test_katib_reads_a_line_without_timestamp_at_time_zero(one_process):
    line = next(line for line in one_process[1].split("\n") if re.match(r"\S+Z epoch=1 ", line))
    bare = line.split(" ", 1)[1]
    assert [ts for ts, _, _ in katib_text_observations(bare)] == [ZERO_TIME] * 5
    assert [v for _, _, v in katib_text_observations(bare)] == [v for _, _, v in katib_text_observations(line)]
    # a launcher prefix before the timestamp (torchrun --tee) loses the timestamp the same way
    assert {ts for ts, _, _ in katib_text_observations("[default0]:" + line)} == {ZERO_TIME}


@pytest.mark.parametrize(
    ("values", "line"),
    [
        ({"epoch": 3, "loss": 12.125, "bbox_ap": 0.1234}, "epoch=3 loss=12.125 bbox_ap=0.1234"),
        ({"bbox_ap": 1e-05, "bbox_ap50": -1.0, "loss": 1.5e16}, "bbox_ap=1e-05 bbox_ap50=-1.0 loss=1.5e+16"),
        ({"epoch": 0, "loss": float("nan"), "bbox_ap": float("inf")}, "epoch=0"),
        ({"bbox_ap": 0.1 + 0.2}, "bbox_ap=0.30000000000000004"),  # every digit: reads back as the same float
    ],
)
def test_metric_line_reads_back_exactly(values, line):
    printed = metric_line(values)
    assert printed.split(" ", 1)[1] == line
    observed = katib_text_observations(printed, tuple(values))
    assert {name: float(value) for _, name, value in observed} == {k: v for k, v in values.items() if math.isfinite(v)}
    assert go_parse_rfc3339nano(printed.split(" ", 1)[0]) is not None


def test_metric_line_refuses_names_katib_cannot_read():
    with pytest.raises(ValueError, match="AP@50"):
        metric_line({"AP@50": 0.5})
    assert metric_line({"loss": float("nan")}) == ""


def test_katib_reads_the_evaluation_only_run(one_process, train_synth, tmp_path, capsys, no_dino_env):
    from dinops.train.main import main as train_main

    checkpoint = one_process[0] / checkpoints.LATEST
    assert train_main(tiny_train_args(train_synth, tmp_path, *SAME, "--eval", "true", "--resume", str(checkpoint))) == 0
    stats = json.loads((tmp_path / "eval.json").read_text())["stats"]
    observed = katib_text_observations(capsys.readouterr().out, ("bbox_ap", "bbox_ap50", "bbox_ap75"))
    assert [(name, float(value)) for _, name, value in observed] == [
        ("bbox_ap", stats["AP"]), ("bbox_ap50", stats["AP50"]), ("bbox_ap75", stats["AP75"])
    ]  # fmt: skip
    assert go_parse_rfc3339nano(observed[0][0]) is not None
