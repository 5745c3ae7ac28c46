"""The lazy recording fast path of an array and a Python scalar (array._operator's method):
the nodes and summary it makes equal what the rule path (runtime.record) makes, each node
keeps the user's line however the op was reached, and the process eager setting it reads
inline follows set_eager and the environment."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import runtime, settings
from pygpukit.ir import Node

array_mod = sys.modules["pygpukit.array"]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(5)


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    runtime._SCHEDULE_CACHE.clear()
    array_mod.forget_scalar_ops()


def _shape_of(n: Node, x: Node) -> Any:
    """What a node is, its inputs by op and attrs (x: the array operand, by identity)."""
    ins = tuple("x" if i is x else (i.op, i.attrs, i.shape, i.dtype.name) for i in n.inputs)
    return (n.op, n.attrs, n.canonical_attrs(), n.shape, n.dtype.name, ins, n.realized)


def _line_below() -> int:
    return inspect.currentframe().f_back.f_lineno + 1  # type: ignore[union-attr]


CASES: list[tuple[str, Callable[[Any, Any], Any], Callable[[Any, Any], Any], Any, str]] = [
    ("add", lambda x, s: x + s, lambda x, s: x + s, 0.5, "float32"),
    ("radd", lambda x, s: s + x, lambda x, s: s + x, 2, "float32"),
    ("rsub", lambda x, s: s - x, lambda x, s: s - x, 1.25, "float32"),
    ("mul negative zero", lambda x, s: x * s, lambda x, s: x * s, -0.0, "float32"),
    ("rtruediv", lambda x, s: s / x, lambda x, s: s / x, 3.0, "float32"),
    ("pow", lambda x, s: x**s, lambda x, s: x**s, 2, "float32"),
    ("lt", lambda x, s: x < s, lambda x, s: x < s, 0.25, "float32"),
    ("ne nan", lambda x, s: x != s, lambda x, s: x != s, float("nan"), "float32"),
    ("and bool", lambda x, s: x & s, lambda x, s: x & s, True, "int32"),
    ("rmod", lambda x, s: s % x, lambda x, s: s % x, 7, "int32"),
    ("gpk.maximum", lambda x, s: gpk.maximum(x, s), np.maximum, 0.0, "float32"),
    ("gpk.subtract reflected", lambda x, s: gpk.subtract(s, x), lambda x, s: s - x, 4, "int32"),
]


@pytest.mark.parametrize("name, fn, ref, scalar, dtype", CASES, ids=[c[0] for c in CASES])
def test_fast_path_makes_what_the_rule_path_makes(
    name: str, fn: Callable[[Any, Any], Any], ref: Callable[[Any, Any], Any], scalar: Any,
    dtype: str, rng: np.random.Generator,
) -> None:  # fmt: skip
    if dtype == "int32":
        h = rng.integers(1, 50, size=(3, 5)).astype(np.int32)
    else:
        h = rng.uniform(0.5, 2.0, size=(3, 5)).astype(np.float32)
    x = gpk.asarray(h)
    y = x * 1 if dtype == "int32" else x * 1.0  # a pending operand: its summary is extended
    learnt = len(array_mod._SCALAR_OPS)
    by_rules = fn(y, scalar)  # the first of its kind: the rule path, which teaches the fast one
    assert len(array_mod._SCALAR_OPS) == learnt + 1
    fast = fn(y, scalar)
    assert len(array_mod._SCALAR_OPS) == learnt + 1
    a, b = by_rules._node, fast._node
    consts = [next(i for i in n.inputs if i is not y._node) for n in (a, b)]
    assert a is not b and consts[0] is not consts[1]  # a `full` node each, as before
    assert _shape_of(b, y._node) == _shape_of(a, y._node)
    assert [_shape_of(i, y._node) for i in b.inputs] == [_shape_of(i, y._node) for i in a.inputs]
    assert b.sub[:3] == a.sub[:3] and b.leaves == a.leaves and b.used == a.used
    expect = ref(h.astype(np.float64) if dtype == "float32" else h.astype(np.int64), scalar)
    for out in (by_rules, fast):
        np.testing.assert_allclose(out.to_numpy(), expect, rtol=1e-6)


def test_every_node_keeps_the_users_line(rng: np.random.Generator) -> None:
    """Operator, reflected operator, gpk.add (ops.py calls binary, which calls the method) and
    np.add (numpy_dispatch under that): the op and its scalar's `full` node both name the
    line the user wrote, on the rule path and on the fast path alike."""
    x = gpk.asarray(rng.standard_normal(8).astype(np.float32))
    for _ in range(3):  # the first records by the rules, the later ones by the fast path
        lines = []
        lines.append(_line_below())
        y = x + 0.5
        lines.append(_line_below())
        y = 2.0 * y
        lines.append(_line_below())
        y = gpk.add(y, 1.5)
        lines.append(_line_below())
        y = np.add(y, 0.25)
        n = y._node
        for line in reversed(lines):
            const = next(i for i in n.inputs if i.op == "full")
            for node in (n, const):
                assert node.loc is not None and node.loc.file == __file__
                assert node.loc.line == line
            n = next(i for i in n.inputs if i.op != "full")
    ref = (x.to_numpy().astype(np.float64) + 0.5) * 2.0 + 1.5 + 0.25
    np.testing.assert_allclose(y.to_numpy(), ref, rtol=1e-6)


def test_inline_eager_setting_follows_set_eager_and_the_environment(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The operators read the process eager setting inline (settings.EAGER_NOW): set_eager
    and a reload after the environment changed must reach them."""
    h = rng.standard_normal(6).astype(np.float32)
    x = gpk.asarray(h)
    for _ in range(2):  # the second is the fast path
        assert (x + 0.5)._node.realized is None
    gpk.set_eager(True)
    y = x + 0.5
    assert y._node.realized is not None  # ran at once
    np.testing.assert_allclose(y.to_numpy(), h.astype(np.float64) + 0.5, rtol=1e-6)
    gpk.set_eager(None)
    assert (x + 0.5)._node.realized is None
    monkeypatch.setenv(settings.EAGER, "1")
    assert (x + 0.5)._node.realized is None  # kept from its first read until reload()
    settings.reload()
    assert (x * 3)._node.realized is not None
    monkeypatch.setenv(settings.EAGER, "0")
    settings.reload()
    assert (x * 3)._node.realized is None


def test_a_learnt_record_is_native(rng: np.random.Generator,
                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Once a key and its operand's summary part were learnt (the rule path, then the Python
    fast path), the record is the native one (rust/pygpukit-py/src/record.rs): no Python
    node maker runs, and it makes the nodes, summary and line the rule path makes."""
    h = rng.uniform(0.5, 2.0, size=7).astype(np.float32)
    x = gpk.asarray(h)
    learnt = [(x * 1.5 + 0.25) - 3 for _ in range(3)]  # rules, Python fast path, native
    python: list[int] = []
    known = array_mod._known_scalar_op

    def counting(*args: Any) -> Any:
        python.append(1)
        return known(*args)

    monkeypatch.setattr(array_mod, "_known_scalar_op", counting)
    line = _line_below()
    y = (x * 1.5 + 0.25) - 3
    assert python == [] and len(array_mod._LAZY_SCALARS) == 3
    a, b = learnt[0]._node, y._node
    for _ in range(3):  # the op node and its constant, down the chain
        assert _shape_of(b, x._node) == _shape_of(a, x._node)
        ca, cb = (next(i for i in n.inputs if i.op == "full") for n in (a, b))
        assert _shape_of(cb, x._node) == _shape_of(ca, x._node) and ca is not cb
        assert b.loc is not None and b.loc.file == __file__ and b.loc.line == line
        assert cb.loc == b.loc and b.id > cb.id
        assert b.sub[:3] == a.sub[:3] and b.leaves == a.leaves and b.used == a.used
        a, b = (next(i for i in n.inputs if i.op != "full") for n in (a, b))
    assert a is b is x._node
    expect = (h.astype(np.float64) * 1.5 + 0.25) - 3
    np.testing.assert_allclose(y.to_numpy(), expect, rtol=1e-6)
    big = 1 << 70  # no native key holds it: the Python path, every time
    z = [x < big for _ in range(3)]
    assert python != [] and len(array_mod._LAZY_SCALARS) == 3
    np.testing.assert_array_equal(z[2].to_numpy(), h < big)


def test_native_operators_name_the_users_line(rng: np.random.Generator, tmp_path: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """GPUArray's binary operators are native method descriptors (rust/pygpukit-py/src/
    operator.rs). Called by the operator, as a bound method, unbound on the class and from
    library code (whose frames the location steps past), lazily and eagerly, every result
    names the user's line and holds what float64 NumPy computes."""
    from pygpukit.ir.source import register_library

    assert type(array_mod.GPUArray.__add__).__name__ == "method_descriptor"
    (tmp_path / "lazy_recording_helper.py").write_text("def half(x):\n    return x * 0.5\n")
    register_library(trees=[str(tmp_path)])
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazy_recording_helper

    h = rng.uniform(0.5, 2.0, size=9).astype(np.float32)
    x = gpk.asarray(h)
    ref = h.astype(np.float64)
    for eager in (False, True):
        with gpk.eager(eager):
            for _ in range(3):  # the first by the rules, the later ones natively
                lines = [_line_below()]
                a = x.__add__(0.5)
                lines.append(_line_below())
                b = array_mod.GPUArray.__rsub__(x, 2.0)
                lines.append(_line_below())
                c = lazy_recording_helper.half(x)
                lines.append(_line_below())
                d = 3 * x
                for out, line, expect in zip((a, b, c, d), lines,
                                             (ref + 0.5, 2.0 - ref, ref * 0.5, 3 * ref),
                                             strict=True):  # fmt: skip
                    n = out._node
                    assert (n.realized is not None) == eager
                    assert n.loc is not None and n.loc.file == __file__ and n.loc.line == line
                    np.testing.assert_allclose(out.to_numpy(), expect, rtol=1e-6)
