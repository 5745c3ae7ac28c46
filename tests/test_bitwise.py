"""& | ^ ~ and gpk.bitwise_* on integer and bool arrays, against NumPy: values and NumPy's
dtype rules, lazy, eager and compiled, with weak Python int scalars; floats raise."""

from __future__ import annotations

import itertools
import operator

import numpy as np
import pytest
from helpers import lazy_and_eager, rand
from passes_util import record

import pygpukit as gpk
from pygpukit.passes.fold import constant_folding

INTS = ["int8", "uint8", "int16", "int32", "int64", "bool"]
BINARY = {
    "and": (operator.and_, gpk.bitwise_and, np.bitwise_and),
    "or": (operator.or_, gpk.bitwise_or, np.bitwise_or),
    "xor": (operator.xor, gpk.bitwise_xor, np.bitwise_xor),
}


def _ints(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random values over the dtype's whole range (sign bits and top bits included)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True, dtype=np.int64).astype(dtype)


def test_integer_and_is_bitwise() -> None:
    a, b = gpk.asarray(np.array([1, 3])), gpk.asarray(np.array([1, 2]))
    np.testing.assert_array_equal((a & b).to_numpy(), [1, 2])
    np.testing.assert_array_equal((a | b).to_numpy(), [1, 3])
    np.testing.assert_array_equal((a ^ b).to_numpy(), [0, 1])
    np.testing.assert_array_equal((~a).to_numpy(), [-2, -4])


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("da,db", list(itertools.product(INTS, INTS)))
def test_binary_values_and_dtypes(name: str, da: str, db: str) -> None:
    op, fn, ref = BINARY[name]
    rng = np.random.default_rng([sorted(BINARY).index(name), INTS.index(da), INTS.index(db)])
    a, b = _ints(rng, (3, 5), da), _ints(rng, (5,), db)
    want = ref(a, b)
    for f in (op, fn):
        lazy, eager = lazy_and_eager(f, a, b)
        assert lazy.dtype == want.dtype, (da, db, lazy.dtype, want.dtype)
        np.testing.assert_array_equal(lazy, want)
        np.testing.assert_array_equal(eager, want)


@pytest.mark.parametrize("dtype", INTS)
def test_invert(dtype: str) -> None:
    a = _ints(np.random.default_rng(11), (4, 6), dtype)
    for f in (operator.invert, gpk.invert, gpk.bitwise_invert):
        lazy, eager = lazy_and_eager(f, a)
        assert lazy.dtype == a.dtype
        np.testing.assert_array_equal(lazy, np.invert(a))
        np.testing.assert_array_equal(eager, np.invert(a))


@pytest.mark.parametrize("dtype", INTS)
def test_compiled_chain(dtype: str) -> None:
    @gpk.compile
    def f(x: gpk.GPUArray, y: gpk.GPUArray) -> gpk.GPUArray:
        return (~(x & y) | (x ^ 3)) & (y | 1)

    rng = np.random.default_rng(12)
    for _ in range(2):
        x, y = _ints(rng, (6, 7), dtype), _ints(rng, (7,), dtype)
        out = f(gpk.from_numpy(x), gpk.from_numpy(y)).to_numpy()
        want = (~(x & y) | (x ^ 3)) & (y | 1)
        assert out.dtype == want.dtype
        np.testing.assert_array_equal(out, want)
    assert f.stats()["hits"] == 1


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("scalar", [5, -2, 255, True, False])
def test_python_scalars_are_weak(dtype: str, scalar: int) -> None:
    a = _ints(np.random.default_rng(13), (2, 3), dtype)
    g = gpk.from_numpy(a)
    for op in (operator.and_, operator.or_, operator.xor):
        for args, gargs in (((a, scalar), (g, scalar)), ((scalar, a), (scalar, g))):
            try:
                want = op(*args)
            except OverflowError:  # NumPy 2: -2 or 255 does not fit this dtype
                with pytest.raises(OverflowError):
                    op(*gargs)
                continue
            got = op(*gargs).to_numpy()
            assert got.dtype == want.dtype, (dtype, scalar, got.dtype, want.dtype)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("da", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("db", ["float32", "int32", "bool"])
def test_floats_raise_like_numpy(da: str, db: str) -> None:
    rng = np.random.default_rng(14)
    a, b = gpk.from_numpy(rand(rng, (3,), da)), gpk.from_numpy(rand(rng, (3,), db))
    for name in BINARY:
        op, fn, ref = BINARY[name]
        with pytest.raises(TypeError):
            ref(a.to_numpy(), b.to_numpy())
        for f in (op, fn):
            with pytest.raises(gpk.DTypeError, match=f"bitwise_{name}: no bitwise_{name} loop"):
                f(a, b)
            with pytest.raises(gpk.DTypeError):
                f(b, a)
    with pytest.raises(gpk.DTypeError, match="invert"):
        operator.invert(a)
    with pytest.raises(gpk.DTypeError):
        a & 1


def test_bool_operands_record_the_logical_ops() -> None:
    # On two bools, & | ~ are the logical ops: the form the mask patterns of the passes match.
    rng = np.random.default_rng(15)
    p, q = gpk.from_numpy(rng.random(8) < 0.5), gpk.from_numpy(rng.random(8) < 0.5)
    assert (p & q).node.op == "logical_and" and (p | q).node.op == "logical_or"
    assert (~p).node.op == "logical_not" and (p & True).node.op == "logical_and"
    assert (p ^ q).node.op == "bitwise_xor"
    assert (p & 1).node.op == "bitwise_and" and (p & 1).dtype == gpk.int64


def test_constant_folding_evaluates_bitwise_ops() -> None:
    def f(x: gpk.GPUArray) -> gpk.GPUArray:
        c = (gpk.full((4,), 12, dtype="int16") & 10) ^ ~gpk.full((4,), 1, dtype="int16")
        return x | c

    x = np.arange(4, dtype=np.int16)
    g, _ = record(f, x)
    out = constant_folding(g)
    out.validate()
    folded = [n for n in out.nodes if n.op == "full"]
    assert len(folded) == 1 and folded[0].attrs["value"] == (12 & 10) ^ ~1
    assert [n.op for n in out.nodes if n.op not in ("input", "full")] == ["bitwise_or"]
    np.testing.assert_array_equal(f(gpk.from_numpy(x)).to_numpy(), x | ((12 & 10) ^ ~1))
