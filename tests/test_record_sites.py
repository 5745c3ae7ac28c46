"""The native lazy record's call sites and the summaries it makes (rust/pygpukit-py/src/
record.rs, frames.rs; pygpukit/pending.py): one location made per user's call site and
shared by its records, never one site's for another's; the summary that is its node's
trail lists every node's location in tree order, and a realize that reuses a schedule
reports the lines of the records it ran."""

from __future__ import annotations

import gc
import inspect
import sys
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import errors, pending, runtime
from pygpukit.ir.source import register_library, resolve

array_mod = sys.modules["pygpukit.array"]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    runtime._SCHEDULE_CACHE.clear()
    runtime._KNOWN.clear()
    array_mod.forget_scalar_ops()


def _line_below() -> int:
    return inspect.currentframe().f_back.f_lineno + 1  # type: ignore[union-attr]


def test_records_at_one_site_share_its_location(rng: np.random.Generator) -> None:
    """Two call sites on one line: each keeps its own location (its code and instruction
    offset), made once and shared by every record there and by the op's `full` node."""
    h = rng.uniform(0.5, 2.0, size=7).astype(np.float32)
    x = gpk.asarray(h)
    outs = []
    for _ in range(4):  # the first by the rules, the later ones natively
        line = _line_below()
        a, b = x + 0.5, x * 3.0
        outs.append((a, b))
    (a2, b2), (a3, b3) = outs[2], outs[3]
    na, nb = a3._node, b3._node
    shared = na.where
    assert a2._node.where is shared and b2._node.where is nb.where
    assert shared is not nb.where and shared[0] is nb.where[0] and shared[1] < nb.where[1]
    assert all(i.where is shared for i in na.inputs if i.op == "full")
    for out in (a2, b2, a3, b3):
        loc = out._node.loc  # resolving sets the node's own `where`, never the shared one
        assert loc is not None and loc.file == __file__ and loc.line == line
    assert type(shared) is tuple and a2._node.where is not shared
    ref = h.astype(np.float64)
    np.testing.assert_allclose(a3.to_numpy(), ref + 0.5, rtol=1e-6)
    np.testing.assert_allclose(b3.to_numpy(), ref * 3.0, rtol=1e-6)


def test_a_function_redefined_at_one_line_names_its_own_code(rng: np.random.Generator,
                                                              tmp_path: Any) -> None:  # fmt: skip
    """A function defined again from the same source (the same file and line, a new code
    object), the first one gone: its records hold the new code, never the old site's."""
    h = rng.uniform(0.5, 2.0, size=5).astype(np.float32)
    x = gpk.asarray(h)
    src = "def f(x):\n    return x * 0.25\n"
    path = str(tmp_path / "redefined.py")
    for _ in range(2):
        ns: dict[str, Any] = {}
        exec(compile(src, path, "exec"), ns)  # noqa: S102
        f = ns["f"]
        ys = [f(x) for _ in range(4)]  # the last two natively, at the site kept
        n = ys[-1]._node
        assert n.where[0] is f.__code__ and n.where is ys[-2]._node.where
        assert n.loc is not None and n.loc.file == path and n.loc.line == 2
        np.testing.assert_allclose(ys[-1].to_numpy(), h.astype(np.float64) * 0.25, rtol=1e-6)
        del ns, f, ys, n
        gc.collect()


def test_a_site_registered_as_library_code_names_its_caller(rng: np.random.Generator,
                                                             tmp_path: Any,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:  # fmt: skip
    """A helper's site kept as the user's names the caller's line once its file is
    registered as library code (ir.source.LIBRARY_GENERATION outdates the kept sites)."""
    (tmp_path / "record_sites_helper.py").write_text("def half(x):\n    return x * 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import record_sites_helper

    x = gpk.asarray(rng.uniform(0.5, 2.0, size=6).astype(np.float32))
    ys = [record_sites_helper.half(x) for _ in range(3)]  # the last ones natively
    loc = ys[-1]._node.loc
    assert loc is not None and loc.file.endswith("record_sites_helper.py") and loc.line == 2
    register_library(trees=[str(tmp_path)])
    for _ in range(2):
        line = _line_below()
        z = record_sites_helper.half(x)
        loc = z._node.loc
        assert loc is not None and loc.file == __file__ and loc.line == line


def test_a_summary_is_its_trail(rng: np.random.Generator) -> None:
    """The summary of a graph recorded natively and by the rules (two arrays' op) lists
    its nodes' locations in tree order, and holds no array (its leaves sit beside it)."""
    x = gpk.asarray(rng.uniform(0.5, 2.0, size=8).astype(np.float32))
    w = gpk.asarray(rng.uniform(0.5, 2.0, size=8).astype(np.float32))
    for _ in range(3):
        y = ((x + 0.5) * w - 1.0) * (x * 2.0)
    root = y._node
    nodes = pending.tree_nodes(root)
    assert list(pending.Trail(root.sub)) == [n.where for n in nodes]
    assert root.leaves == (x._node, w._node)

    def arrays(t: Any) -> bool:
        return any(isinstance(i, gpk.GPUArray | type(root)) or
                   (type(i) is tuple and arrays(i)) for i in t)  # fmt: skip

    assert not arrays(root.sub)


def test_a_known_realize_names_the_lines_it_ran(rng: np.random.Generator) -> None:
    """A realize that reuses a schedule built from records at one site reports, for an
    error in it, the lines of the records it ran, made at another site after the first
    warmed the location cache."""
    h = rng.uniform(0.5, 2.0, size=9).astype(np.float32)
    x = gpk.asarray(h)

    def at_a(x: Any) -> Any:
        return (x + 0.5) * 2.0

    def at_b(x: Any) -> Any:
        return (x + 0.5) * 2.0

    for _ in range(3):
        at_a(x).realize()
    line_b = at_b.__code__.co_firstlineno + 1
    y = at_b(x)
    root = y._node
    expect = [resolve(n.where) for n in pending.tree_nodes(root)]
    assert [loc.line for loc in expect if loc.file == __file__ and loc.func == "at_b"] == [
        line_b
    ] * 4
    hits = runtime.stats["schedule_hits"]
    y.realize()
    assert runtime.stats["schedule_hits"] == hits + 1
    built, now = errors._LAST_RUN[0]  # type: ignore[misc]
    assert [resolve(w) for w in now] == expect
    rebound = errors._rebound(built[0])
    assert rebound is not None and rebound.line == line_b  # type: ignore[attr-defined]
    np.testing.assert_allclose(y.to_numpy(), (h.astype(np.float64) + 0.5) * 2.0, rtol=1e-6)
