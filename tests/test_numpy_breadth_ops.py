"""NumPy breadth (issue 21): // and %, prod/any/all/argmin, var/std, cumsum/cumprod, sort,
argsort, topk, linspace, eye, dot and einsum against NumPy (float64 or the exact integer
result) on random inputs, lazy, eager and compiled, and their bad inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import assert_close, lazy_and_eager, np_dtype, rand

import pygpukit as gpk

AxisError = gpk.errors.AxisError  # an IndexError and a ValueError, as numpy's
ValueErr = gpk.errors.GPUKitValueError
Unsupported = gpk.errors.UnsupportedError
FLOATS = ["float32", "float16", "bfloat16", "float64"]
INTS = ["int8", "uint8", "int32", "int64"]
ALL = FLOATS + INTS + ["bool"]


def _all_modes(fn: Callable[..., Any], *inputs: np.ndarray) -> list[np.ndarray]:
    """fn's result lazy, eager and compiled (a tuple result: its parts, in order)."""
    lazy, eager = lazy_and_eager(lambda *a: _first(fn(*a)), *inputs)
    compiled = gpk.compile(lambda *a: _first(fn(*a)))(*[gpk.from_numpy(i) for i in inputs])
    outs = [lazy, eager, compiled.to_numpy()]
    assert all(o.dtype == outs[0].dtype and o.shape == outs[0].shape for o in outs)
    return outs


def _equal(got: np.ndarray, want: np.ndarray) -> None:
    """Exact equality, NaN equal to NaN (bfloat16 through float32, where NumPy sees NaN)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype == np_dtype("bfloat16"):
        got, want = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_array_equal(got, want)


def _first(r: Any) -> Any:
    return r[0] if isinstance(r, tuple) else r


def _sample(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    return rand(np.random.default_rng(seed), shape, dtype)


# -- // and % ---------------------------------------------------------------------------------


def _divmod_inputs(dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x, y = rand(rng, (4, 33), dtype, low=-20, high=20), rand(rng, (4, 33), dtype, low=-4, high=4)
    if dtype != "bool":
        y[0, :5] = 0  # integers: 0 (NumPy's, with a warning); floats: inf and NaN
    if dtype in ("int8", "int32", "int64"):
        x[1, 0], y[1, 0] = np.iinfo(dtype).min, -1  # wraps, as NumPy's
    return x, y


def _np_divmod(op: str, x: np.ndarray, y: np.ndarray, dtype: str) -> np.ndarray:
    """NumPy's own // or % in the kernels' compute precision (float32 for f16/bf16), rounded
    to the result dtype: exact for integers, and the same floor as the dtype's arithmetic
    for floats (a float64 quotient near an integer could floor the other way)."""
    fn = np.floor_divide if op == "floor_divide" else np.remainder
    with np.errstate(all="ignore"):
        if dtype in ("float16", "bfloat16"):
            return fn(x.astype(np.float32), y.astype(np.float32)).astype(np_dtype(dtype))
        return fn(x, y)


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("op", ["floor_divide", "mod", "remainder"])
def test_floor_divide_and_mod_match_numpy(dtype: str, op: str) -> None:
    x, y = _divmod_inputs(dtype, 1)
    want = _np_divmod(op, x, y, dtype)
    outs = _all_modes(lambda a, b: getattr(gpk, op)(a, b), x, y)
    for out in outs:
        _equal(out, want)
    if dtype in ("float32", "float64"):  # and the dtype's result is the float64 one, rounded
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        ok = (y64 != 0) & (np.abs(x64 / np.where(y64 == 0, 1, y64) % 1 - 0.5) < 0.49)
        ref = _np_divmod(op, x64, y64, "float64")
        assert_close(outs[0][ok], ref[ok], dtype, factor=30)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "int64"])
def test_operators_and_python_scalars(dtype: str) -> None:
    x = _sample(dtype, (5, 7), 2)
    g = gpk.from_numpy(x)
    with np.errstate(all="ignore"):
        cases = [(g // 3, x // 3), (g % -3, x % -3), (7 // g, 7 // x), (-7 % g, -7 % x),
                 (gpk.remainder(g, 4), np.remainder(x, 4))]  # fmt: skip
    for got, want in cases:
        assert got.dtype.np == want.dtype  # NEP 50: the scalar takes the array's dtype
        np.testing.assert_array_equal(got.to_numpy().astype(np.float64), want.astype(np.float64))


def test_float_division_by_zero_gives_numpys_inf_and_nan() -> None:
    x = np.array([1.0, -1.0, 0.0, np.inf, np.nan, 5.5], np.float32)
    y = np.array([0.0, 0.0, 0.0, 2.0, 1.0, -0.0], np.float32)
    for op in ("floor_divide", "remainder"):
        want = _np_divmod(op, x, y, "float32")
        for got in _all_modes(lambda a, b, op=op: getattr(gpk, op)(a, b), x, y):
            np.testing.assert_array_equal(got, want)


# -- reductions -------------------------------------------------------------------------------

AXES: list[Any] = [None, 0, -1, (0, 2), 1]


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("op", ["prod", "any", "all", "argmin"])
def test_reductions_match_numpy(dtype: str, op: str) -> None:
    x = _sample(dtype, (3, 5, 4), 3)
    if dtype in FLOATS:
        x = (x / 2 + 1).astype(x.dtype)  # products of ~1: no overflow in f16
        x[0, 1, 2] = 0  # any/all see a zero
    for axis in AXES:
        if op == "argmin" and isinstance(axis, tuple):
            continue
        for keep in (False, True):

            def fn(a: gpk.GPUArray, axis: Any = axis, keep: bool = keep) -> gpk.GPUArray:
                return getattr(gpk, op)(a, axis, keepdims=keep)

            x64 = x.astype(np.float64) if dtype in FLOATS else x
            want = getattr(np, op)(x64, axis=axis, keepdims=keep)
            for got in _all_modes(fn, x):
                if op in ("any", "all"):
                    assert got.dtype == np.bool_
                    np.testing.assert_array_equal(got, want)
                elif op == "argmin":
                    assert got.dtype == np.int64
                    np.testing.assert_array_equal(got, np.argmin(x, axis, keepdims=keep))
                elif dtype in FLOATS:
                    assert got.dtype == x.dtype
                    assert_close(got, want, dtype, factor=8)
                else:  # integers and bools multiply in int64 (NumPy: the platform int)
                    assert got.dtype == np.int64
                    np.testing.assert_array_equal(got, want.astype(np.int64))


def test_reduction_methods_nan_and_empty() -> None:
    x = np.array([[3.0, np.nan, -1.0, np.nan], [2.0, 2.0, -5.0, -5.0]], np.float32)
    g = gpk.from_numpy(x)
    np.testing.assert_array_equal(g.argmin(1).to_numpy(), np.argmin(x, 1))  # first NaN
    np.testing.assert_array_equal(g.argmin().to_numpy(), np.argmin(x))
    np.testing.assert_array_equal(g.any(0).to_numpy(), x.any(0))
    np.testing.assert_array_equal(g.all(1, keepdims=True).to_numpy(), x.all(1, keepdims=True))
    np.testing.assert_array_equal(g.prod(1).to_numpy(), x.prod(1))
    e = gpk.from_numpy(np.zeros((0, 3), np.float32))
    np.testing.assert_array_equal(e.any(0).to_numpy(), np.zeros(3, bool))
    np.testing.assert_array_equal(e.all(0).to_numpy(), np.ones(3, bool))
    np.testing.assert_array_equal(e.prod(0).to_numpy(), np.ones(3, np.float32))


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("fn", ["var", "std"])
def test_var_std_match_numpy(dtype: str, fn: str) -> None:
    x = _sample(dtype, (4, 6, 5), 4)
    x64 = x.astype(np.float64)
    for axis, ddof, keep in ((None, 0, False), (1, 1, True), ((0, 2), 0, False), (-1, 2, True)):
        want = getattr(np, fn)(x64, axis=axis, ddof=ddof, keepdims=keep)
        outs = _all_modes(lambda a, axis=axis, ddof=ddof, keep=keep:
                          getattr(gpk, fn)(a, axis, ddof=ddof, keepdims=keep), x)  # fmt: skip
        for got in outs:
            # integers and bools give the default float (docs/dtypes.md), not NumPy's float64
            assert got.dtype == (x.dtype if dtype in FLOATS else np.float32)
            assert_close(got, want, dtype if dtype in FLOATS else "float32", factor=8)


def test_var_is_two_pass_in_float32() -> None:
    """Data far from zero: E[x^2] - E[x]^2 in float32 would lose every digit."""
    x = (1e4 + np.random.default_rng(5).standard_normal((8, 4096))).astype(np.float32)
    want = np.var(x.astype(np.float64), axis=1)
    got = gpk.from_numpy(x).var(axis=1).to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3)
    got_std = gpk.from_numpy(x).std(axis=1, ddof=1).to_numpy()
    np.testing.assert_allclose(got_std, np.std(x.astype(np.float64), axis=1, ddof=1), rtol=1e-3)


def test_var_with_ddof_past_n_is_inf_or_nan_as_numpy() -> None:
    x = np.array([[1.0, 2.0], [3.0, 3.0]], np.float32)
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        want = np.var(x, axis=1, ddof=2)
    np.testing.assert_array_equal(gpk.from_numpy(x).var(axis=1, ddof=2).to_numpy(), want)


# -- scans ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scans_match_numpy(dtype: str, op: str) -> None:
    x = _sample(dtype, (3, 70, 4), 6)
    if op == "cumprod" and dtype in FLOATS:
        x = (x / 8 + 1).astype(x.dtype)  # products stay in f16's range
    for axis in (None, 0, 1, -1):
        x64 = x.astype(np.float64) if dtype in FLOATS else x
        want = getattr(np, op)(x64, axis=axis)
        for got in _all_modes(lambda a, axis=axis: getattr(gpk, op)(a, axis), x):
            if dtype in FLOATS:
                assert got.dtype == x.dtype
                assert_close(got, want, dtype, factor=16)
            else:  # NumPy accumulates integers and bools in the platform int
                assert got.dtype == np.int64
                np.testing.assert_array_equal(got, want.astype(np.int64))


def test_scan_methods_dtype_argument_and_long_rows() -> None:
    x = _sample("int32", (2, 3000), 7)
    g = gpk.from_numpy(x)
    np.testing.assert_array_equal(g.cumsum(1).to_numpy(), np.cumsum(x, 1))
    got = g.cumsum(1, dtype="int8").to_numpy()
    np.testing.assert_array_equal(got, np.cumsum(x, 1, dtype=np.int8))
    assert got.dtype == np.int8
    y = _sample("bfloat16", (5,), 8)
    np.testing.assert_array_equal(gpk.from_numpy(y).cumprod(dtype="float32").to_numpy(),
                                  np.cumprod(y.astype(np.float32)))  # fmt: skip
    np.testing.assert_array_equal(gpk.cumsum(np.float32(3)).to_numpy(), np.cumsum(np.float32(3)))


# -- sort, argsort, topk ----------------------------------------------------------------------


def _with_nans_and_ties(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    x = _sample(dtype, shape, seed)
    flat = x.reshape(-1)
    if dtype in FLOATS:
        flat[::7] = np.nan
        flat[3::11] = flat[5]  # ties
        flat[4::13] = -0.0
    return x


@pytest.mark.parametrize("dtype", ALL)
def test_sort_and_argsort_match_numpy(dtype: str) -> None:
    x = _with_nans_and_ties(dtype, (4, 37, 3), 9)
    key = x.astype(np.float32) if dtype == "bfloat16" else x  # ml_dtypes sorts NaN anywhere
    for axis in (-1, 0, 1, None):
        want = np.sort(key, axis=axis).astype(x.dtype)
        want_idx = np.argsort(key, axis=axis, kind="stable")
        for got in _all_modes(lambda a, axis=axis: gpk.sort(a, axis), x):
            _equal(got, want)  # NaN last, as NumPy
        for kind in (None, "stable", "quicksort"):
            for got in _all_modes(lambda a, axis=axis, kind=kind: gpk.argsort(a, axis, kind), x):
                assert got.dtype == np.int64
                np.testing.assert_array_equal(got, want_idx)  # stable: ties in index order


def _topk_ref(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """torch.topk's order: best first, NaN the largest, ties by lower index."""
    xm = np.moveaxis(x, axis, -1)
    key = xm.astype(np.float64)
    if largest:  # stable sort of the negated key; NaN first
        order = np.argsort(np.where(np.isnan(key), -np.inf, -key), axis=-1, kind="stable")
        nan_first = np.argsort(~np.isnan(np.take_along_axis(key, order, -1)), -1, kind="stable")
        order = np.take_along_axis(order, nan_first, -1)
    else:
        order = np.argsort(key, axis=-1, kind="stable")
    idx = order[..., :k]
    vals = np.take_along_axis(xm, idx, -1)
    return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "int8", "uint8", "bool"])
def test_topk_matches_a_stable_reference(dtype: str) -> None:
    x = _with_nans_and_ties(dtype, (3, 50), 10)
    for k, axis, largest in ((5, -1, True), (1, 1, False), (50, -1, True), (2, 0, True),
                             (0, -1, False)):  # fmt: skip
        want_v, want_i = _topk_ref(x, k, axis, largest)
        for mode_v, mode_i in zip(*[_all_modes(lambda a, p=p, k=k, axis=axis, largest=largest:
                                               gpk.topk(a, k, axis, largest)[p], x)
                                    for p in (0, 1)], strict=True):  # fmt: skip
            _equal(mode_v, want_v)
            _equal(mode_i, want_i)


def test_sort_method_sorts_in_place_through_a_view() -> None:
    x = _sample("float32", (4, 6), 11)
    g = gpk.from_numpy(x)
    v = g[1:3]
    v.sort(axis=1)
    want = x.copy()
    want[1:3].sort(axis=1)
    np.testing.assert_array_equal(g.to_numpy(), want)
    w = g.T
    w.sort(0, kind="stable")
    want.T.sort(0)
    np.testing.assert_array_equal(g.to_numpy(), want)
    np.testing.assert_array_equal(g.argsort(0).to_numpy(), np.argsort(want, 0, kind="stable"))


def test_long_rows_sort() -> None:
    x = _with_nans_and_ties("float32", (2, 5000), 12)
    np.testing.assert_array_equal(gpk.sort(gpk.from_numpy(x)).to_numpy(), np.sort(x))


# -- creation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(0, 1, 5), (-2.5, 7.25, 13, False), (3, -1, 1), (1, 2, 0),
                                  (0.1, 0.7, 50), (-3, 3, 10, True, "int32"),
                                  (0, 1, 7, True, "bfloat16"), (2, 2, 4)])  # fmt: skip
def test_linspace_matches_numpy(args: tuple[Any, ...]) -> None:
    start, stop, num, *rest = args
    endpoint = rest[0] if rest else True
    dtype = rest[1] if len(rest) > 1 else "float32"
    want = (
        np.linspace(start, stop, num, endpoint=endpoint, dtype=np.float64).astype(np_dtype(dtype))
        if dtype != "int32"
        else np.linspace(start, stop, num, endpoint, dtype=np.int32)
    )
    got = gpk.linspace(start, stop, num, endpoint, dtype)
    assert got.dtype.name == dtype
    # exact on the host; a GPU may fuse start + step * i into one rounding (1 ulp)
    eps = np.finfo(want.dtype).eps if want.dtype.kind == "f" else 0
    np.testing.assert_allclose(
        got.to_numpy(), want, rtol=eps, atol=eps * np.abs(want).max(initial=0)
    )


@pytest.mark.parametrize("args", [(3,), (3, 5), (4, 2, -1), (5, 5, 2, "int8"), (2, 3, 9),
                                  (0, 3), (4, None, 1, "bool")])  # fmt: skip
def test_eye_matches_numpy(args: tuple[Any, ...]) -> None:
    n, *rest = args
    m = rest[0] if rest else None
    k = rest[1] if len(rest) > 1 else 0
    dtype = rest[2] if len(rest) > 2 else "float32"
    got = gpk.eye(n, m, k, dtype)
    assert got.dtype.name == dtype
    np.testing.assert_array_equal(got.to_numpy(), np.eye(n, m, k, dtype=dtype))


def test_creation_inside_compile() -> None:
    @gpk.compile
    def f(x: gpk.GPUArray) -> gpk.GPUArray:
        return x * gpk.linspace(0, 1, 4) + gpk.eye(4)

    x = _sample("float32", (4, 4), 13)
    want = x * np.linspace(0, 1, 4, dtype=np.float32) + np.eye(4, dtype=np.float32)
    np.testing.assert_allclose(f(gpk.from_numpy(x)).to_numpy(), want, rtol=1e-6)


# -- dot and einsum ---------------------------------------------------------------------------

DOT_SHAPES = [
    ((5,), (5,)),
    ((3, 5), (5,)),
    ((5,), (5, 4)),
    ((3, 5), (5, 4)),
    ((2, 3, 5), (5,)),
    ((2, 3, 5), (4, 5, 6)),
    ((3, 5), (2, 5, 6)),
    ((), (3, 4)),
    ((5,), (2, 5, 3)),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "int32", "bool"])
@pytest.mark.parametrize(("sa", "sb"), DOT_SHAPES)
def test_dot_matches_numpy(dtype: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a, b = _sample(dtype, sa, 14), _sample(dtype, sb, 15)
    f64 = dtype in FLOATS
    want = np.dot(a.astype(np.float64), b.astype(np.float64)) if f64 else np.dot(a, b)
    for got in _all_modes(gpk.dot, a, b):
        assert got.shape == want.shape
        if f64:
            assert_close(got, want, dtype, factor=16)
        else:
            np.testing.assert_array_equal(got, want)
    method = gpk.from_numpy(a).dot(gpk.from_numpy(b)).to_numpy()
    np.testing.assert_array_equal(method, gpk.dot(a, b).to_numpy())


EINSUMS = [("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("ij->ji", [(3, 4)]),
           ("ij->", [(3, 4)]), ("ijk->j", [(2, 3, 4)]), ("i,i->", [(5,), (5,)]),
           ("i,j->ij", [(3,), (4,)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
           ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]), ("b...d,bd->b...", [(2, 3, 4), (2, 4)]),
           ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("abc,cd,bd->a", [(2, 3, 4), (4, 5),
                                                                        (3, 5)]),
           ("bhqd,bhkd->bhqk", [(1, 2, 3, 8), (1, 2, 5, 8)]), ("ij,ij->i", [(3, 4), (3, 4)]),
           ("i...->...", [(3, 2, 2)]), ("ab,b->a", [(3, 1), (4,)]),
           ("ik,kj->ji", [(3, 4), (4, 5)])]  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32"])
@pytest.mark.parametrize(("spec", "shapes"), EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_matches_numpy(dtype: str, spec: str, shapes: list[tuple[int, ...]]) -> None:
    ops = [_sample(dtype, s, 16 + i) for i, s in enumerate(shapes)]
    f64 = dtype in FLOATS
    want = np.einsum(spec, *[o.astype(np.float64) if f64 else o for o in ops])
    for got in _all_modes(lambda *a: gpk.einsum(spec, *a), *ops):
        assert got.shape == want.shape
        if f64:
            assert got.dtype == ops[0].dtype
            assert_close(got, want, dtype, factor=16)
        else:
            np.testing.assert_array_equal(got, want)


def test_einsum_lowers_to_matmuls_not_loops() -> None:
    a, b = gpk.from_numpy(_sample("float32", (8, 64, 32), 20)), gpk.from_numpy(
        _sample("float32", (8, 32, 16), 21))  # fmt: skip
    out = gpk.einsum("bij,bjk->bik", a, b)
    ops: set[str] = set()
    stack = [out.node]
    while stack:
        n = stack.pop()
        ops.add(n.op)
        stack.extend(n.inputs)
    assert "matmul" in ops and len(ops) <= 4, ops


# -- bad inputs -------------------------------------------------------------------------------

BAD: list[tuple[str, Callable[[gpk.GPUArray], Any], type, str]] = [
    ("sort axis", lambda g: gpk.sort(g, axis=2), AxisError, "sort"),
    ("argsort axis", lambda g: gpk.argsort(g, axis=-3), AxisError, "argsort"),
    ("cumsum axis", lambda g: gpk.cumsum(g, axis=5), AxisError, "cumsum"),
    ("cumprod axis", lambda g: g.cumprod(axis=-3), AxisError, "cumprod"),
    ("prod axis", lambda g: gpk.prod(g, axis=(0, 2)), AxisError, "prod"),
    ("any axis", lambda g: g.any(axis=3), AxisError, "any"),
    ("var axis", lambda g: gpk.var(g, axis=2), AxisError, "var"),
    ("std axis", lambda g: g.std(axis=(1, 1)), gpk.ShapeError, "std"),
    ("argmin tuple", lambda g: gpk.argmin(g, axis=(0, 1)), gpk.DTypeError, "argmin"),
    ("topk k", lambda g: gpk.topk(g, 9), gpk.ShapeError, "topk"),
    ("topk negative k", lambda g: gpk.topk(g, -1), gpk.ShapeError, "topk"),
    ("topk float k", lambda g: gpk.topk(g, 2.0), gpk.DTypeError, "topk"),
    ("topk axis", lambda g: gpk.topk(g, 1, axis=2), AxisError, "topk"),
    ("sort kind", lambda g: gpk.sort(g, kind="bogo"), ValueErr, "sort"),
    ("sort order", lambda g: gpk.sort(g, order="x"), ValueErr, "sort"),
    ("sort kind+stable", lambda g: gpk.sort(g, kind="stable", stable=True),
     ValueErr, "sort"),
    ("mod string", lambda g: gpk.mod(g, "a"), gpk.DTypeError, "remainder"),
    ("floordiv string", lambda g: g // "a", gpk.DTypeError, "floor_divide"),
    ("var ddof", lambda g: gpk.var(g, ddof="1"), gpk.DTypeError, "var"),
    ("einsum arity", lambda g: gpk.einsum("ij,jk->ik", g), ValueErr, "einsum"),
    ("einsum label", lambda g: gpk.einsum("i1->i", g), ValueErr, "einsum"),
    ("einsum dims", lambda g: gpk.einsum("ijk->i", g), ValueErr, "einsum"),
    ("einsum output", lambda g: gpk.einsum("ij->iz", g), ValueErr, "einsum"),
    ("einsum two arrows", lambda g: gpk.einsum("ij->i->j", g), ValueErr, "einsum"),
    ("einsum sizes", lambda g: gpk.einsum("ij,ij->i", g, g.T), gpk.ShapeError, "einsum"),
    ("einsum diagonal", lambda g: gpk.einsum("ii->i", g[:, :4]), Unsupported, "einsum"),
    ("einsum not str", lambda g: gpk.einsum(3, g), gpk.DTypeError, "einsum"),
    ("dot shapes", lambda g: gpk.dot(g, g), gpk.ShapeError, "dot"),
    ("linspace num", lambda g: gpk.linspace(0, 1, -1), ValueErr, "linspace"),
    ("linspace start", lambda g: gpk.linspace("a", 1), gpk.DTypeError, "linspace"),
    ("eye shape", lambda g: gpk.eye(-2), gpk.ShapeError, "eye"),
    ("eye k", lambda g: gpk.eye(2, k=1.5), gpk.DTypeError, "eye"),
    ("inplace sort readonly", lambda g: gpk.broadcast_to(g, (2, 4, 8)).sort(),
     ValueErr, "setitem"),
]  # fmt: skip


@pytest.mark.parametrize(("label", "call", "cls", "op"), BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_raise_clear_errors(label: str, call: Callable[[gpk.GPUArray], Any],
                                       cls: type, op: str) -> None:  # fmt: skip
    g = gpk.from_numpy(_sample("float32", (4, 8), 22))
    with pytest.raises(cls) as err:
        out = call(g)
        for o in out if isinstance(out, tuple) else (out,):
            o.to_numpy()
    msg = str(err.value)
    assert isinstance(err.value, gpk.GPUKitError)
    assert msg.startswith(op) or f"{op}:" in msg, msg
    assert "test_numpy_breadth_ops.py" in msg, msg


def test_axis_errors_are_index_and_value_errors_as_numpys() -> None:
    g = gpk.from_numpy(_sample("float32", (4, 8), 23))
    for call in (lambda: gpk.sort(g, 3), lambda: gpk.cumsum(g, -3), lambda: g.prod(2)):
        with pytest.raises(IndexError) as e:
            call()
        assert isinstance(e.value, ValueError) and "out of bounds" in str(e.value)
        assert "f32[4, 8]" in str(e.value)


def test_public_names_are_listed() -> None:
    names = [
        "floor_divide",
        "mod",
        "remainder",
        "prod",
        "any",
        "all",
        "argmin",
        "var",
        "std",
        "cumsum",
        "cumprod",
        "sort",
        "argsort",
        "topk",
        "linspace",
        "eye",
        "dot",
        "einsum",
    ]
    for n in names:
        assert n in gpk.ops.__all__ and callable(getattr(gpk, n)) and getattr(gpk, n).__doc__
    for m in (
        "prod",
        "any",
        "all",
        "argmin",
        "var",
        "std",
        "cumsum",
        "cumprod",
        "sort",
        "argsort",
        "dot",
        "__floordiv__",
        "__rfloordiv__",
        "__mod__",
        "__rmod__",
    ):
        assert callable(getattr(gpk.GPUArray, m))
