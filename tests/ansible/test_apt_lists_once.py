"""roles/apt_lists checks a host's package lists once per run, not once per play (site.yml has five plays whose
roles depend on it), and again in the next run. Run for real on this machine with ansible-playbook: the lists hold
an index here, and apt_lists_valid_time is a day, so apt downloads nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
APT = "Download the package lists when they hold no index or are older than apt_lists_valid_time"
FIND = "Find the package indexes the lists hold"


def _play(name: str) -> dict:
    return {
        "name": name,
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable, "apt_lists_valid_time": 86400},
        "roles": ["apt_lists"],
    }


def _run(tmp_path: Path, plays: list[dict]) -> dict:
    playbook = tmp_path / "plays.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    config = tmp_path / "ansible.cfg"
    config.write_text(f"[defaults]\nroles_path = {REPO / 'roles'}\nstdout_callback = ansible.builtin.json\n")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(playbook)],
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(config)},
        cwd=REPO,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


def _ran(report: dict, task: str) -> list[bool]:
    """Per play: whether ``task`` ran (True) or was skipped (False)."""
    runs = []
    for play in report["plays"]:
        results = [t["hosts"]["localhost"] for t in play["tasks"] if t["task"]["name"] == f"apt_lists : {task}"]
        assert len(results) == 1, f"{task}: {len(results)} results in play {play['play']['name']}"
        runs.append(not results[0].get("skipped", False))
    return runs


def test_the_lists_are_checked_by_the_first_play_only(tmp_path):
    report = _run(tmp_path, [_play("first"), _play("second"), _play("third")])
    assert _ran(report, FIND) == [True, False, False]
    assert _ran(report, APT) == [True, False, False]


def test_the_next_run_checks_them_again(tmp_path):
    """The memory is the run's (a fact that is not cached): a later run checks the lists again."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _ran(_run(tmp_path / "a", [_play("one")]), APT) == [True]
    assert _ran(_run(tmp_path / "b", [_play("one")]), APT) == [True]
