"""The layering rules, read from the source with `ast` (every import, also inside functions):
ir/ imports nothing above it, passes/ import no backend, llm, cli, bench or scheduler;
and `import pygpukit` leaves the heavy subpackages for first use."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Modules each tree must not import (a prefix covers its submodules). `pygpukit` alone in
# IR_FORBIDS means the package root and every front-end module: only pygpukit.ir is allowed.
IR_FORBIDS = ("pygpukit", "passes")
IR_ALLOWS = ("pygpukit.ir",)
PASSES_FORBIDS = ("pygpukit.backends", "pygpukit.llm", "pygpukit.cli", "pygpukit.bench",
                  "pygpukit.scheduler")  # fmt: skip


def imported_modules(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in `source`, a module of `package`:
    statements at any depth, `from X import name` as X.name (name may be a module; a
    forbidden X is a prefix of it), and importlib.import_module / __import__ calls with a
    literal name."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            arg = node.args[0]
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                if isinstance(arg.value, str):
                    yield node.lineno, arg.value


def _matches(module: str, prefixes: tuple[str, ...]) -> str | None:
    for p in prefixes:
        if module == p or module.startswith(p + "."):
            return p
    return None


def violations(tree: str) -> list[tuple[str, int, str]]:
    """(file relative to the root, line, module) of each import that breaks `tree`'s rule."""
    package = {"ir": "pygpukit.ir", "passes": "pygpukit.passes"}[tree]
    out = []
    for path in sorted((ROOT / tree).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, module in imported_modules(path.read_text(encoding="utf-8"), package):
            if tree == "ir":
                bad = _matches(module, IR_FORBIDS) and not _matches(module, IR_ALLOWS)
            else:
                bad = bool(_matches(module, PASSES_FORBIDS))
            if bad:
                out.append((rel, line, module))
    return out


def test_ir_imports_nothing_above_it() -> None:
    assert violations("ir") == []


def test_passes_import_no_backend_llm_cli_or_scheduler() -> None:
    assert violations("passes") == []


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("import pygpukit\n", "pygpukit.ir", "pygpukit"),
        ("def f():\n    from pygpukit.backends import cuda\n", "pygpukit.passes",
         "pygpukit.backends.cuda"),
        ("from .. import backends\n", "pygpukit.passes", "pygpukit.backends"),
        ("from ..passes.fold import x\n", "pygpukit.ir", "pygpukit.passes.fold.x"),
        ("import importlib\nm = importlib.import_module('pygpukit.passes')\n", "pygpukit.ir",
         "pygpukit.passes"),
    ],
)  # fmt: skip
def test_checker_sees_every_kind_of_import(source: str, package: str, expected: str) -> None:
    assert expected in {m for _, m in imported_modules(source, package)}


def test_import_pygpukit_leaves_heavy_modules_for_first_use() -> None:
    """Scheduler, Task and gpk.llm resolve lazily (PEP 562); cli and bench are never loaded."""
    code = (
        "import sys, pygpukit as gpk\n"
        "heavy = ('pygpukit.llm', 'pygpukit.cli', 'pygpukit.bench', 'pygpukit.scheduler')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in"
        " [h.split('.') for h in heavy]))\n"
        "names = dir(gpk)\n"
        "print(all(n in names for n in ('Scheduler', 'Task', 'llm', 'set_backend')))\n"
        "from pygpukit.scheduler import Scheduler, Task\n"
        "import pygpukit.llm\n"
        "print(gpk.Scheduler is Scheduler, gpk.Task is Task, gpk.llm is pygpukit.llm)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=True)  # fmt: skip
    assert out.stdout.split("\n")[:3] == ["[]", "True", "True True True"]


def test_unknown_attribute_is_an_attribute_error() -> None:
    import pygpukit as gpk

    with pytest.raises(AttributeError, match="no_such_name"):
        gpk.no_such_name  # noqa: B018
