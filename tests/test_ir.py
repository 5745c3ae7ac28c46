"""The IR itself: printer, validation, structure keys, networkx export."""

from __future__ import annotations

import pytest

from pygpukit.ir import Graph, GraphError, Node, dtypes


def small_graph() -> tuple[Graph, Node]:
    x = Node("input", (), {"shape": (2, 8), "dtype": "bf16", "idx": 0}, (2, 8), dtypes.bfloat16)
    w = Node("input", (), {"shape": (8,), "dtype": "bf16", "idx": 1}, (8,), dtypes.bfloat16)
    y = Node.make("rms_norm", (x, w), {"eps": 1e-6})
    z = Node.make("sum", (Node.make("exp", (y,)),), {"axes": (1,), "keepdims": False})
    return Graph([x, w], [z], name="block"), y


def test_printer_reads_like_a_program() -> None:
    g, _ = small_graph()
    text = str(g)
    assert text.splitlines()[0] == "def block(in0: bf16[2,8], in1: bf16[8]):"
    assert "t0: bf16[2,8] = rms_norm(in0, in1, eps=1e-06)" in text
    assert "t2: bf16[2] = sum(t1, axes=(1,), keepdims=False)" in text
    assert text.splitlines()[-1] == "  return t2"


def test_validate_catches_wrong_types() -> None:
    g, y = small_graph()
    g.validate()
    y.shape = (3, 8)
    with pytest.raises(GraphError):
        g.validate()


def test_structure_key_ignores_identity() -> None:
    a, _ = small_graph()
    b, _ = small_graph()
    assert a.key() == b.key()


def test_networkx_export() -> None:
    g, _ = small_graph()
    nxg = g.to_networkx()
    assert nxg.number_of_nodes() == len(g.nodes)
    assert {d["op"] for _, d in nxg.nodes(data=True)} == {"input", "rms_norm", "exp", "sum"}


def test_recorded_location_is_resolved_when_read() -> None:
    """Recording keeps the user's frame cheaply; reading .loc gives this file and line."""
    import numpy as np

    import pygpukit as gpk

    a = gpk.asarray(np.random.default_rng(0).random(4, dtype=np.float32))
    y = a + 1.5
    line = __import__("inspect").currentframe().f_lineno - 1
    node = y._node
    assert isinstance(node.where, tuple)  # (code, offset): no SourceLoc made yet
    loc = node.loc
    assert loc is not None and loc.file == __file__ and loc.line == line
    assert loc.func == "test_recorded_location_is_resolved_when_read"
    assert node.where is loc  # resolved once, kept
    np.testing.assert_allclose(y.to_numpy(), a.to_numpy().astype(np.float64) + 1.5, rtol=1e-6)


def _here_twice() -> tuple[int, int]:
    """The caller's line as f_lineno reads it and as source.line_at finds it from f_lasti."""
    import sys

    from pygpukit.ir.source import line_at

    f = sys._getframe(1)
    return f.f_lineno, line_at(f.f_code, f.f_lasti)


def test_captured_offset_resolves_to_the_frames_line() -> None:
    """Recording keeps f_lasti, not f_lineno: resolving it gives the line f_lineno gives, on
    every line of a statement spread over several and inside a loop and a comprehension."""
    seen = [
        _here_twice(),
        (
            0,
            _here_twice(),
        )[1],
    ]
    for _ in range(2):
        seen.append(_here_twice())
    seen += [_here_twice() for _ in range(2)]
    assert len({a for a, _ in seen}) == 4  # four distinct lines were asked about
    for by_lineno, by_offset in seen:
        assert by_offset == by_lineno


def test_canonical_attrs_tell_signed_zeros_apart() -> None:
    """Keys see 0.0 and -0.0 as different values (they compare and hash equal) and a NaN
    as equal to itself; the cached form is what a fresh computation gives."""
    from pygpukit.ir.node import canonical_items

    def full(v: float) -> Node:
        return Node.make("full", (), {"shape": [2], "dtype": "float32", "value": v})

    pos, neg = full(0.0), full(-0.0)
    assert pos.canonical_attrs() != neg.canonical_attrs()
    assert full(float("nan")).canonical_attrs() == full(float("nan")).canonical_attrs()
    assert pos.attrs["shape"] == (2,)
    for n in (pos, neg):
        assert n.canonical_attrs() == canonical_items(n.attrs)
        built = Node(n.op, (), n.attrs, n.shape, n.dtype, frozen=True)
        assert built.canonical_attrs() == n.canonical_attrs()
