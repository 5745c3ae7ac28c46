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
