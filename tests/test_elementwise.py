"""Elementwise ops vs float64 NumPy, lazy and eager, on random shapes, dtypes, broadcasts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import ALL, FLOATS, INTS, assert_close, lazy_and_eager, np_dtype, rand
from hypothesis import given, settings
from hypothesis import strategies as st

import pygpukit as gpk

SETTINGS = settings(max_examples=25, deadline=None)

shapes = st.lists(st.integers(1, 5), min_size=0, max_size=4).map(tuple)


@st.composite
def broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast: drop leading dims and set some dims to 1 on either side."""
    base = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4))
    a = [d if draw(st.booleans()) else 1 for d in base]
    b = [d if draw(st.booleans()) else 1 for d in base]
    a = a[draw(st.integers(0, len(a))) :]
    b = b[draw(st.integers(0, len(b))) :]
    return tuple(a), tuple(b)


def default_float(numpy_result: np.dtype, *ins: np.dtype) -> np.dtype:
    """docs/dtypes.md: NumPy's result dtype, except that float64 only comes from float64 (a
    float from integer inputs alone, or a float64 without a float64 input, is float32)."""
    if numpy_result.kind != "f":
        return numpy_result
    if not any(d.kind == "f" or d == gpk.bfloat16 for d in ins):
        return np.dtype(np.float32)
    if numpy_result == np.float64 and np.float64 not in ins:
        return np.dtype(np.float32)
    return numpy_result


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


UNARY_REF = {
    "exp": (gpk.exp, np.exp, False),
    "log": (gpk.log, np.log, True),
    "sqrt": (gpk.sqrt, np.sqrt, True),
    "rsqrt": (gpk.rsqrt, lambda x: 1 / np.sqrt(x), True),
    "sin": (gpk.sin, np.sin, False),
    "cos": (gpk.cos, np.cos, False),
    "tanh": (gpk.tanh, np.tanh, False),
    "sigmoid": (gpk.sigmoid, lambda x: 1 / (1 + np.exp(-x)), False),
    "erf": (gpk.erf, _erf, False),
    "neg": (lambda x: -x, np.negative, False),
    "abs": (abs, np.abs, False),
}


@pytest.mark.parametrize("name", sorted(UNARY_REF))
@pytest.mark.parametrize("dtype", FLOATS + ["float64"])
@given(shape=shapes, seed=st.integers(0, 2**32 - 1))
@SETTINGS
def test_unary_float(name: str, dtype: str, shape: tuple[int, ...], seed: int) -> None:
    fn, ref_fn, positive = UNARY_REF[name]
    x = rand(np.random.default_rng(seed), shape, dtype, positive=positive)
    lazy, eager = lazy_and_eager(fn, x)
    ref = ref_fn(x.astype(np.float64))
    assert lazy.dtype == np_dtype(dtype) and lazy.shape == shape
    assert_close(lazy, ref, dtype, factor=2)
    np.testing.assert_array_equal(lazy, eager)


@pytest.mark.parametrize("dtype", INTS)
def test_unary_on_ints_gives_the_default_float(dtype: str) -> None:
    x = rand(np.random.default_rng(), (3, 4), dtype, positive=True)
    out = gpk.sqrt(gpk.from_numpy(x)).to_numpy()
    assert out.dtype == np.float32  # docs/dtypes.md: not NumPy's float16/float64
    np.testing.assert_allclose(out.astype(np.float64), np.sqrt(x.astype(np.float64)), rtol=1e-3)
    np.testing.assert_array_equal((-gpk.from_numpy(x)).to_numpy(), -x)
    np.testing.assert_array_equal(abs(gpk.from_numpy(x)).to_numpy(), np.abs(x))


BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.true_divide),
    "maximum": (gpk.maximum, np.maximum),
    "minimum": (gpk.minimum, np.minimum),
    "eq": (lambda a, b: a == b, np.equal),
    "ne": (lambda a, b: a != b, np.not_equal),
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "gt": (lambda a, b: a > b, np.greater),
    "ge": (lambda a, b: a >= b, np.greater_equal),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(
    shapes_=broadcast_pair(),
    da=st.sampled_from(ALL[:-1]),
    db=st.sampled_from(ALL[:-1]),
    seed=st.integers(0, 2**32 - 1),
)
@SETTINGS
def test_binary_broadcast_and_promotion(name: str, shapes_, da: str, db: str, seed: int) -> None:
    fn, ref_fn = BINARY[name]
    rng = np.random.default_rng(seed)
    a = rand(rng, shapes_[0], da)
    b = rand(rng, shapes_[1], db, positive=name == "div")
    lazy, eager = lazy_and_eager(fn, a, b)
    # NumPy's own ufunc type resolution, with the default-float rule, is the reference.
    expected_dtype = default_float(ref_fn.resolve_dtypes((a.dtype, b.dtype, None))[-1],
                                   a.dtype, b.dtype)  # fmt: skip
    assert lazy.dtype == expected_dtype, (da, db, lazy.dtype, expected_dtype)
    assert lazy.shape == np.broadcast_shapes(a.shape, b.shape)
    # Our small random values are exact in float64, so comparisons agree there too.
    ref = ref_fn(a.astype(np.float64), b.astype(np.float64))
    out_name = "bool" if lazy.dtype == np.bool_ else np.dtype(lazy.dtype).name
    if out_name in INTS + ["int16"]:
        ref = ref_fn(a.astype(np.int64), b.astype(np.int64)).astype(lazy.dtype)
    assert_close(lazy, ref.astype(np.float64), out_name, factor=2)
    np.testing.assert_array_equal(lazy, eager)


@pytest.mark.parametrize("dtype", ALL[:-1])
@pytest.mark.parametrize("scalar", [2, -3, 0.5, True])
def test_python_scalars_are_weak(dtype: str, scalar: float) -> None:
    x = rand(np.random.default_rng(), (2, 3), dtype, positive=True)
    if isinstance(scalar, float) and dtype in INTS:
        want = np.dtype(np.float32)  # docs/dtypes.md: the default float, not float64
    elif isinstance(scalar, bool):
        want = np_dtype(dtype)
    else:
        want = np_dtype(dtype)
    g = gpk.from_numpy(x)
    if dtype == "uint8" and scalar == -3:
        with pytest.raises(OverflowError):  # as NumPy 2 does
            g * scalar
        return
    for out in (g * scalar, scalar * g, g + scalar, scalar - g):
        assert out.dtype.np == want
    ref = x.astype(np.float64) * float(scalar)
    assert_close((g * scalar).to_numpy(), ref, want.name if want.name in FLOATS + ["float64"]
                 else dtype)  # fmt: skip


@given(shape=shapes, seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(FLOATS))
@SETTINGS
def test_pow_where_clip(shape: tuple[int, ...], seed: int, dtype: str) -> None:
    rng = np.random.default_rng(seed)
    x = rand(rng, shape, dtype, positive=True)
    y = rand(rng, shape, dtype)
    c = rng.random(shape) < 0.5
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    lazy, eager = lazy_and_eager(lambda a, b: a**b, x, y)
    assert_close(lazy, x64**y64, dtype, factor=4)
    lazy, eager = lazy_and_eager(lambda k, a, b: gpk.where(k, a, b), c, x, y)
    assert_close(lazy, np.where(c, x64, y64), dtype)
    np.testing.assert_array_equal(lazy, eager)
    lazy, eager = lazy_and_eager(lambda a: gpk.clip(a, -1.0, 1.5), y)
    assert_close(lazy, np.clip(y64, -1.0, 1.5), dtype)
    np.testing.assert_array_equal(lazy, eager)


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("dst", ALL)
def test_astype(src: str, dst: str) -> None:
    x = rand(np.random.default_rng(), (3, 5), src)
    if dst in INTS and src in FLOATS + ["float64"]:
        x = np.clip(x, 0 if dst == "uint8" else -100, 100)  # C casts of out-of-range floats are UB
    out = gpk.from_numpy(x).astype(dst).to_numpy()
    assert out.dtype == np_dtype(dst)
    np.testing.assert_array_equal(out, x.astype(np_dtype(dst)))


def test_logical_ops_on_bool() -> None:
    rng = np.random.default_rng()
    a, b = rng.random(7) < 0.5, rng.random(7) < 0.5
    ga, gb = gpk.from_numpy(a), gpk.from_numpy(b)
    np.testing.assert_array_equal((ga & gb).to_numpy(), a & b)
    np.testing.assert_array_equal((ga | gb).to_numpy(), a | b)
    np.testing.assert_array_equal((~ga).to_numpy(), ~a)
