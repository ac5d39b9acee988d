"""The data floor stands below training: nothing in dinops.data imports dinops.train, at module level or inside a
function (a lazy import still makes a circle across floors: training imports the data package)."""

from __future__ import annotations

import ast
from pathlib import Path

import dinops.data

DATA = Path(dinops.data.__file__).parent
HIGHER = ("dinops.train", "dinops.serve", "dinops.client")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement of the file names, relative imports resolved against dinops.data."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "dinops.data".rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_the_walk_sees_lazy_and_relative_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from dinops.train.main import x\n\nfrom ..train import settings\n")
    assert {name for _, name in imported_modules(probe)} >= {"dinops.train.main", "dinops.train.settings"}


def test_dinops_data_imports_no_higher_floor():
    files = sorted(DATA.rglob("*.py"))
    assert files
    offending = [
        f"{path.relative_to(DATA.parent)}:{line} imports {name}"
        for path in files
        for line, name in imported_modules(path)
        if any(name == floor or name.startswith(floor + ".") for floor in HIGHER)
    ]
    assert not offending, "dinops.data must not import a higher floor:\n" + "\n".join(offending)
