"""Every module runs under an interpreter that can import what it needs, as the user it runs as.

The class of defect behind round2-hosts-cluster F1-F3: inventories/local ran every module under the controller's
venv (`{{ ansible_playbook_python }}`), which holds ansible and nothing the modules import. deb822_repository (no
python-debian, no respawn), community.docker (no requests) and every task that becomes the `minikube` user (who
cannot execute a Python under /root) failed on a real host, while Molecule, which uses the containers' own Python,
passed. Three checks:

1. facts/module_imports.yml is true of the installed, pinned modules (its evidence is in their source);
2. the local inventory names a system interpreter that every user can execute;
3. every task of every role that uses a module of that table runs where the library is: the role installs its
   package into the host's Python, or the task runs under a venv interpreter the role provides.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((REPO / "facts/module_imports.yml").read_text())["modules"]
SITE_PACKAGES = Path(yaml.__file__).resolve().parents[1]
TASK_KEYWORDS = {
    "name", "when", "register", "vars", "tags", "loop", "loop_control", "with_items", "until", "retries", "delay",
    "changed_when", "failed_when", "environment", "become", "become_user", "become_method", "notify", "listen",
    "delegate_to", "run_once", "no_log", "check_mode", "diff", "args", "module_defaults", "ignore_errors",
    "block", "rescue", "always", "timeout", "throttle", "any_errors_fatal", "async", "poll", "connection",
    "delegate_facts", "local_action", "action", "collections", "debugger", "ignore_unreachable", "with_dict",
    "with_fileglob", "with_together", "with_subelements", "with_sequence", "with_first_found", "with_nested",
}  # fmt: skip
INCLUDES = {"ansible.builtin.include_tasks", "ansible.builtin.import_tasks"}


def _fact_for(module: str) -> dict | None:
    for fact in FACTS:
        match = fact["match"]
        if (match.endswith(".") and module.startswith(match)) or module == match:
            return fact
    return None


# --- 1. the table is true of the pinned modules ------------------------------------------------------------------
@pytest.mark.parametrize("fact", FACTS, ids=[f["match"] for f in FACTS])
def test_the_table_matches_the_installed_modules(fact):
    source = SITE_PACKAGES / fact["evidence"]["file"]
    assert source.is_file(), f"{source} is not in the pinned ansible bundle: facts/module_imports.yml is stale"
    text = source.read_text()
    assert fact["evidence"]["text"] in text, f"{source} no longer says {fact['evidence']['text']!r}"
    if "absent" in fact:
        assert fact["absent"] not in text, f"{source} now says {fact['absent']!r}: update the table"


# --- 2. the local inventory's interpreter --------------------------------------------------------------------------
def _local_host_vars() -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    out = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-inventory")), "-i", "inventories/local", "--host", "localhost"],
        cwd=REPO, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return yaml.safe_load(out.stdout)


def test_the_local_inventory_runs_modules_under_the_system_python():
    interpreter = _local_host_vars().get("ansible_python_interpreter", "auto_silent")
    assert "{{" not in interpreter and "ansible_playbook_python" not in interpreter, (
        f"inventories/local runs modules under {interpreter!r}: the controller's venv, which has none of the "
        "libraries the modules import (python-debian, requests) and which other users cannot execute"
    )
    assert interpreter.startswith("/usr/bin/"), interpreter


def test_every_user_can_execute_the_local_interpreter():
    """become_user tasks (minikube start as `minikube`) execute the interpreter as that user: every directory on
    the way and the file itself must be open to others, as the system Python's are (a venv under /root is not)."""
    interpreter = Path(_local_host_vars()["ansible_python_interpreter"])
    if not interpreter.exists():
        pytest.fail(f"{interpreter} does not exist on this machine")
    for path in [interpreter, *interpreter.parents, interpreter.resolve(), *interpreter.resolve().parents]:
        mode = path.stat().st_mode
        wanted = stat.S_IXOTH if path.is_dir() or path == interpreter.resolve() else 0
        assert mode & wanted == wanted, f"{path} (mode {oct(mode & 0o777)}) cannot be traversed by other users"


def test_a_venv_under_a_private_home_is_caught(tmp_path):
    """The check above goes red on the old setting: a venv interpreter inside a 0700 directory."""
    home = tmp_path / "root-home"
    (home / ".venv/bin").mkdir(parents=True)
    python = home / ".venv/bin/python3"
    python.symlink_to(sys.executable)
    home.chmod(0o700)
    assert not all(p.stat().st_mode & stat.S_IXOTH for p in [home, *home.parents] if p.is_dir())


# --- 3. every task runs where its module's library is ---------------------------------------------------------------
def _module_of(task: dict) -> str | None:
    keys = [k for k in task if k not in TASK_KEYWORDS and not k.startswith("with_")]
    return keys[0] if keys else None


def _walk(path: Path, inherited: dict, seen: set, out: list) -> None:
    """Collect (file, task, module, interpreter) for every task reachable from ``path``, carrying the vars of the
    blocks and includes around it (the interpreter a task runs under)."""
    key = (path, inherited.get("ansible_python_interpreter"))
    if key in seen or not path.is_file():
        return
    seen.add(key)
    for task in yaml.safe_load(path.read_text()) or []:
        _task(path, task, inherited, seen, out)


def _task(path: Path, task: dict, inherited: dict, seen: set, out: list) -> None:
    scope = inherited | (task.get("vars") or {})
    if "block" in task:
        for part in ("block", "rescue", "always"):
            for inner in task.get(part) or []:
                _task(path, inner, scope, seen, out)
        return
    module = _module_of(task)
    if module in INCLUDES:
        target = task[module] if isinstance(task[module], str) else task[module]["file"]
        pattern = target.split("{{")[0] + "*" + target.split("}}")[-1] if "{{" in target else target
        for included in sorted(path.parent.glob(pattern)):
            _walk(included, scope, seen, out)
        return
    out.append((path, task, module, scope.get("ansible_python_interpreter")))


def _role_tasks(role: Path) -> list:
    out, seen = [], set()
    _walk(role / "tasks/main.yml", {}, seen, out)
    for handlers in sorted((role / "handlers").glob("*.yml")):
        _walk(handlers, {}, seen, out)
    reached = {path for path, _ in seen}
    for other in sorted((role / "tasks").rglob("*.yml")):  # entry points of tasks_from, never included by main
        if other not in reached:
            _walk(other, {}, seen, out)
    return out


def _installed_packages(role: Path) -> set[str]:
    """Packages an apt task of the role installs (names written out in the task, or in the role's defaults)."""
    defaults_file = role / "defaults/main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.is_file() else {}
    names: set[str] = set()
    for _, task, module, _ in _role_tasks(role):
        if module != "ansible.builtin.apt" or not isinstance(task[module], dict) or "name" not in task[module]:
            continue
        name = task[module]["name"]
        values = name if isinstance(name, list) else [name]
        for value in values:
            names.add(value)
            for variable, default in (defaults or {}).items():
                if variable in str(value):
                    names.update(default if isinstance(default, list) else [str(default)])
    return names


ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "tasks/main.yml").is_file())


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_module_runs_under_an_interpreter_that_has_its_library(role):
    installed = _installed_packages(role)
    problems = []
    for path, task, module, interpreter in _role_tasks(role):
        fact = _fact_for(module or "")
        if fact is None or fact.get("respawns"):
            continue
        where = f"{path.relative_to(REPO)}: {task.get('name', module)!r} ({module})"
        if interpreter:
            assert "venv" in str(interpreter), f"{where} runs under {interpreter}: not a venv the role provides"
            continue
        if fact["package"] is None:
            problems.append(f"{where} needs {fact['imports']} and runs under the host's Python, which has none")
        elif fact["package"] not in installed:
            problems.append(f"{where} imports {fact['imports']}; the role never installs {fact['package']}")
    assert not problems, "\n".join(problems)


def test_the_walk_sees_the_interpreter_of_enclosing_blocks():
    """The workloads role runs kubernetes.core inside a block that sets the venv interpreter: the walk must see
    it there, or check 3 could not tell a venv task from a host-Python task."""
    tasks = _role_tasks(REPO / "roles/workloads")
    k8s = [interp for _, _, module, interp in tasks if (module or "").startswith("kubernetes.core.")]
    assert k8s and all(interp and "workloads_python_venv" in interp for interp in k8s)
    docker = [interp for _, _, module, interp in _role_tasks(REPO / "roles/images")
              if (module or "").startswith("community.docker.")]  # fmt: skip
    assert docker and not any(docker)


def test_every_role_that_installs_packages_refreshes_empty_lists_first():
    """A host whose lists were just emptied looks fresh to cache_valid_time (roles/apt_lists/README.md): every role
    with an apt install depends on apt_lists."""
    missing = []
    for role in ROLES:
        if role.name == "apt_lists" or not _installed_packages(role):
            continue
        meta = yaml.safe_load((role / "meta/main.yml").read_text())
        deps = [d["role"] if isinstance(d, dict) else d for d in meta.get("dependencies") or []]
        if "apt_lists" not in deps:
            missing.append(role.name)
    assert not missing, f"roles installing packages without the apt_lists dependency: {missing}"


def test_every_apt_task_waits_for_the_dpkg_lock():
    """A fresh or just-rebooted VM holds the dpkg lock for minutes (unattended-upgrades, apt-daily): the module's
    60 s default fails the run (round2-hosts-cluster F12)."""
    short = []
    for role in ROLES:
        for path, task, module, _ in _role_tasks(role):
            if module == "ansible.builtin.apt" and "lock_timeout" not in (task[module] or {}):
                short.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert not short, "apt tasks with the 60 s lock default:\n" + "\n".join(short)
