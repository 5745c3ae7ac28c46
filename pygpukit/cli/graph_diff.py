"""`pygpukit graph diff A.json B.json`: what changed between two `graph dump --format json`.

Exit status as diff(1): 0 when the two are the same, 1 when they differ, 2 on trouble
(a file that cannot be read or is not a dump).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from .console import UsageError


@dataclass
class DumpSummary:
    """The parts of a dump that diff compares."""

    nodes: list[str]  # one signature per node of the final graph: op dtype[shape] loc
    report: set[str]  # the fusion report's lines
    arena_bytes: int | None
    kernels: int


def _summary(doc: Any) -> DumpSummary:
    # Raises KeyError/TypeError/... on a document of another shape; read_dump names it.
    from pygpukit.passes.patterns import format_report

    if not isinstance(doc, dict):
        raise TypeError(f"the top level is a JSON {type(doc).__name__}, not an object")
    graphs = doc["graphs"]
    final = graphs[-1]["graph"]["nodes"] if graphs else []
    nodes = [f"{n['op']} {n['dtype']}{n['shape']} {n['loc']}".rstrip() for n in final]
    plan = doc.get("memory_plan", {})
    arena = plan.get("arena_bytes")
    if arena is not None and not isinstance(arena, int):
        raise TypeError(f"memory_plan.arena_bytes is {arena!r}")
    return DumpSummary(nodes, set(format_report(doc.get("report", []))), arena,
                       len(doc.get("kernels", [])))  # fmt: skip


def read_dump(path: str) -> DumpSummary:
    """Load and check one dump; UsageError naming the file when it is not one."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read {path}: {e}") from None
    try:
        return _summary(doc)
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise UsageError(
            f"{path} is not the output of `pygpukit graph dump --format json` ({what})"
        ) from None


def _counts(nodes: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for sig in nodes:
        op = sig.split(" ", 1)[0]
        out[op] = out.get(op, 0) + 1
    return out


def diff(args: argparse.Namespace) -> int:
    """Print the differences; 0 when there are none, 1 when there are (as diff(1))."""
    a, b = read_dump(args.a), read_dump(args.b)
    changed = False
    print(f"--- {args.a}\n+++ {args.b}")
    print("# ops")
    ca, cb = _counts(a.nodes), _counts(b.nodes)
    for op in sorted(set(ca) | set(cb)):
        if ca.get(op, 0) != cb.get(op, 0):
            changed = True
            print(f"  {op:<20} {ca.get(op, 0):>4} -> {cb.get(op, 0)}")
    for title, old, new in (("nodes", set(a.nodes), set(b.nodes)),
                            ("fusion report", a.report, b.report)):  # fmt: skip
        print(f"# {title}")
        for s in sorted(old - new):
            changed = True
            print(f"  - {s}")
        for s in sorted(new - old):
            changed = True
            print(f"  + {s}")
    print(f"# arena {a.arena_bytes} -> {b.arena_bytes} bytes; kernels "
          f"{a.kernels} -> {b.kernels}")  # fmt: skip
    changed = changed or a.arena_bytes != b.arena_bytes or a.kernels != b.kernels
    if not changed:
        print("(no differences)")
    return 1 if changed else 0


def add_parser(sub: Any) -> None:
    """Register `graph diff` under `pygpukit graph`."""
    f = sub.add_parser("diff", help="what changed between two `dump --format json` files "
                       "(exit 0: same, 1: different, 2: trouble)")  # fmt: skip
    f.add_argument("a")
    f.add_argument("b")
    f.set_defaults(func=diff, error_status=2)
