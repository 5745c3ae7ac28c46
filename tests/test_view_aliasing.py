"""Views alias their base as in NumPy: writes through basic-index, transpose and reshape
views reach the base and its other views (lazy, eager, compiled); broadcast views are
read-only. Also: scalar stores checked against the dtype, freeing a pending input, and
zero-size reshapes."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from helpers import rand

import pygpukit as gpk

MODES = ["lazy", "eager"]


def _mode(mode: str) -> contextlib.AbstractContextManager[None]:
    return gpk.eager() if mode == "eager" else contextlib.nullcontext()


# Each program takes (array, module) and writes through views; `module` is np or a
# namespace over gpk, so the same code runs on both and NumPy is the reference.
def _slice_rows(a, xp):
    v = a[1:3]
    v[...] = 0
    return a


def _transpose_col(a, xp):
    t = a.T
    t[1] = -1
    return a


def _reshape_stride(a, xp):
    r = a.reshape(-1)
    r[::5] = 7
    return a


def _chain(a, xp):
    c = a[::2, 1:][None, :, ::-1]
    c[0, 1, 0] = 55
    s = c[0]
    s[0] = 3
    return a


def _sibling_views(a, xp):
    v1, v2 = a[0:2], a[1:3]
    v1[...] = 9
    return v2 * 1


def _base_write_shows_in_view(a, xp):
    v = a.T[1:]
    a[0] = 4
    return v * 1


def _copying_reshape(a, xp):
    r = a.T.reshape(-1)  # not a view (NumPy copies): the base keeps its values
    r[0] = 100
    return a


def _flatten_copies(a, xp):
    f = a.flatten()
    f[0] = 100
    return a


def _astype_same_copies(a, xp):
    b = a.astype(a.dtype)
    b[0] = 100
    return a


def _squeeze_unsqueeze(a, xp):
    u = a[None][:, 1]
    u[0, 2] = 5
    return a


PROGRAMS = [_slice_rows, _transpose_col, _reshape_stride, _chain, _sibling_views,
            _base_write_shows_in_view, _copying_reshape, _flatten_copies,
            _astype_same_copies, _squeeze_unsqueeze]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_writes_through_views_match_numpy(program, mode: str) -> None:
    x = rand(np.random.default_rng(3), (3, 4), "float32")
    ref = program(x.copy(), np)
    with _mode(mode):
        out = program(gpk.from_numpy(x), gpk)
        np.testing.assert_array_equal(out.to_numpy(), ref)


def test_view_base_and_base_attribute() -> None:
    a = gpk.from_numpy(np.arange(6, dtype=np.float32))
    assert a.base is None
    assert a[1:].base is a
    assert a[1:].T.base is not None
    assert (a + 1).base is None


def test_compiled_write_through_argument_view() -> None:
    @gpk.compile
    def f(v):
        v[0] = 3.0
        return v * 2

    x = rand(np.random.default_rng(4), (3, 4), "float32")
    a = gpk.from_numpy(x)
    lazy_base = gpk.from_numpy(x) + 1  # a pending base: its view must still share memory
    out = f(a[1])
    out2 = f(lazy_base[2])
    ref = x.copy()
    ref[1, 0] = 3.0
    np.testing.assert_array_equal(a.to_numpy(), ref)
    np.testing.assert_array_equal(out.to_numpy(), ref[1] * 2)
    ref2 = x + 1
    ref2[2, 0] = 3.0
    np.testing.assert_array_equal(lazy_base.to_numpy(), ref2)
    np.testing.assert_array_equal(out2.to_numpy(), ref2[2] * 2)


def test_compiled_write_through_captured_view() -> None:
    cache = gpk.zeros((2, 4))
    layer = cache[1]

    @gpk.compile
    def store(x):
        layer[1:3] = x
        return x + 1

    rng = np.random.default_rng(5)
    ref = np.zeros((2, 4), np.float32)
    for _ in range(3):  # a miss, then hits
        x = rand(rng, (2,), "float32")
        store(gpk.from_numpy(x))
        ref[1, 1:3] = x
        np.testing.assert_array_equal(cache.to_numpy(), ref)
        np.testing.assert_array_equal(layer.to_numpy(), ref[1])


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_view_is_read_only(mode: str) -> None:
    with _mode(mode):
        a = gpk.from_numpy(np.arange(4, dtype=np.float32))
        b = gpk.broadcast_to(a, (2, 4))
        with pytest.raises(ValueError) as np_err:
            np.broadcast_to(np.arange(4.0), (2, 4))[0] = 1
        with pytest.raises(gpk.GPUKitError) as err:
            b[0] = 1
        assert isinstance(err.value, np_err.type)
        assert "read-only" in str(err.value) and "test_view_aliasing.py" in str(err.value)
        with pytest.raises(gpk.GPUKitError):
            b[1:][0, 0] = 1  # a view of a broadcast view
        np.testing.assert_array_equal(a.to_numpy(), np.arange(4))


# -- scalar stores follow NumPy 2 ------------------------------------------------------------

STORES = [("int32", math.nan), ("int32", math.inf), ("int32", -math.inf), ("int8", 300),
          ("int8", -129), ("uint8", -1), ("int64", 2**70), ("int8", 1e10),
          ("int16", np.float32("nan"))]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("dtype", "value"), STORES)
def test_bad_scalar_store_raises_like_numpy(dtype: str, value, mode: str) -> None:
    ref = np.zeros(3, dtype)
    with pytest.raises(Exception) as np_err:
        ref[0] = value
    with _mode(mode):
        a = gpk.zeros(3, dtype=dtype)
        with pytest.raises(gpk.GPUKitError) as err:
            a[0] = value
        assert isinstance(err.value, np_err.type), (err.value, np_err.value)
        assert "setitem" in str(err.value) and "test_view_aliasing.py" in str(err.value)
        np.testing.assert_array_equal(a.to_numpy(), np.zeros(3))


@pytest.mark.parametrize(("dtype", "value"), [("int8", 127), ("uint8", 255), ("int32", 2.9),
                                              ("bool", 5), ("float16", 1e6), ("int64", -2**63),
                                              ("float32", 2**70)])  # fmt: skip
def test_good_scalar_store_matches_numpy(dtype: str, value) -> None:
    ref = np.zeros(3, dtype)
    with np.errstate(all="ignore"):
        ref[1] = value
    a = gpk.zeros(3, dtype=dtype)
    a[1] = value
    np.testing.assert_array_equal(a.to_numpy(), ref)


@pytest.mark.parametrize(
    ("op", "name"),
    [("add", "add"), ("subtract", "sub"), ("multiply", "mul"), ("maximum", "maximum")],
)
def test_weak_scalar_out_of_range_raises_overflow(op: str, name: str) -> None:
    x = np.arange(3, dtype=np.int8)
    with pytest.raises(OverflowError):
        getattr(np, op)(x, 300)
    with pytest.raises(gpk.errors.GPUKitOverflowError) as err:
        getattr(gpk, op)(gpk.from_numpy(x), 300)
    assert name in str(err.value) and "test_view_aliasing.py" in str(err.value)


# -- freeing a pending input -----------------------------------------------------------------


@pytest.mark.parametrize("realized", [False, True])
def test_freeing_an_input_of_a_pending_graph_raises(realized: bool) -> None:
    x = rand(np.random.default_rng(6), (5,), "float32")
    a = gpk.from_numpy(x) * 2
    if realized:
        a.realize()
    other = gpk.from_numpy(x)
    b = a + other
    before = gpk.pool_stats()
    a.free()
    with pytest.raises(gpk.FreedArrayError) as err:
        b.to_numpy()
    msg = str(err.value)
    assert "input 0" in msg and "f32[5]" in msg and "test_view_aliasing.py" in msg
    with pytest.raises(gpk.FreedArrayError):
        a.to_numpy()
    np.testing.assert_array_equal(other.to_numpy(), x)  # nothing else was freed
    after = gpk.pool_stats()
    assert _in_use(after) <= _in_use(before)  # the failed realize left nothing behind


def _in_use(stats) -> int:
    return int(stats["in_use_bytes"])


# -- zero-size reshapes ----------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "new"), [((2, 0), (0, 1)), ((2, 0), (0, 5, 3)),
                                            ((0,), (3, 0)), ((3, 0, 2), (0, 7))])  # fmt: skip
def test_zero_size_reshape(shape, new) -> None:
    ref = np.zeros(shape, np.float32).reshape(new)
    for mode in MODES:
        with _mode(mode):
            out = gpk.zeros(shape).reshape(new)
            assert out.to_numpy().shape == ref.shape
            t = gpk.zeros(shape[::-1]).T.reshape(new)  # a non-contiguous empty view
            assert t.to_numpy().shape == ref.shape
    out = gpk.compile(lambda a: a.reshape(new))(gpk.zeros(shape))
    assert out.to_numpy().shape == ref.shape
