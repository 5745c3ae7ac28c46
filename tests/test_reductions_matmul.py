"""Reductions and matmul vs float64 NumPy, lazy and eager."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FLOATS, INTS, assert_close, lazy_and_eager, rand
from hypothesis import given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=30, deadline=None)


@st.composite
def shape_and_axis(draw: st.DrawFn) -> tuple[tuple[int, ...], object]:
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    kind = draw(st.sampled_from(["none", "int", "neg", "tuple"]))
    nd = len(shape)
    if kind == "none":
        return shape, None
    if kind == "int":
        return shape, draw(st.integers(0, nd - 1))
    if kind == "neg":
        return shape, draw(st.integers(-nd, -1))
    axes = draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True))
    return shape, tuple(axes)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@given(sa=shape_and_axis(), keep=st.booleans(), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from(FLOATS + ["float64"] + INTS))  # fmt: skip
@SETTINGS
def test_reductions(op: str, sa, keep: bool, seed: int, dtype: str) -> None:
    shape, axis = sa
    x = rand(np.random.default_rng(seed), shape, dtype)
    lazy, eager = lazy_and_eager(lambda a: getattr(a, op)(axis=axis, keepdims=keep), x)
    ref = getattr(np, op)(x.astype(np.float64), axis=axis, keepdims=keep)
    np_out = getattr(np, op)(x, axis=axis, keepdims=keep)
    assert lazy.shape == np_out.shape
    if op == "sum" and dtype in INTS:
        assert lazy.dtype == np.int64
    elif op == "mean" and dtype in INTS:
        assert lazy.dtype == np.float32  # docs/dtypes.md: the default float
    else:
        assert lazy.dtype == x.dtype
    name = np.dtype(lazy.dtype).name
    assert_close(lazy, ref, name, factor=4 * (1 + x.size // 8))
    np.testing.assert_array_equal(lazy, eager)


@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple),
       keep=st.booleans(), seed=st.integers(0, 2**32 - 1), data=st.data())  # fmt: skip
@SETTINGS
def test_argmax(shape, keep: bool, seed: int, data) -> None:
    x = np.random.default_rng(seed).permutation(np.prod(shape)).reshape(shape).astype(np.float32)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    lazy, eager = lazy_and_eager(lambda a: a.argmax(axis=axis, keepdims=keep), x)
    np.testing.assert_array_equal(lazy, np.argmax(x, axis=axis, keepdims=keep))
    np.testing.assert_array_equal(lazy, eager)


@st.composite
def matmul_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    m, k, n = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    ba = tuple(d if draw(st.booleans()) else 1 for d in batch)[draw(st.integers(0, len(batch))) :]
    bb = tuple(d if draw(st.booleans()) else 1 for d in batch)[draw(st.integers(0, len(batch))) :]
    a = (k,) if draw(st.integers(0, 4)) == 0 else ba + (m, k)
    b = (k,) if draw(st.integers(0, 4)) == 0 else bb + (k, n)
    return a, b


@given(shapes_=matmul_shapes(), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from(FLOATS + ["float64", "int32", "int8"]))  # fmt: skip
@SETTINGS
def test_matmul_batched_broadcast_1d(shapes_, seed: int, dtype: str) -> None:
    rng = np.random.default_rng(seed)
    a, b = rand(rng, shapes_[0], dtype), rand(rng, shapes_[1], dtype)
    lazy, eager = lazy_and_eager(lambda x, y: x @ y, a, b)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert lazy.shape == ref.shape and lazy.dtype == a.dtype
    if dtype == "int8":
        np.testing.assert_array_equal(lazy, np.matmul(a, b))  # wraps like NumPy
    else:
        assert_close(lazy, ref, dtype, factor=2 * shapes_[0][-1])
    np.testing.assert_array_equal(lazy, eager)
