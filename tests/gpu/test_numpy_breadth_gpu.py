"""NumPy breadth (issue 21) on the CUDA backend: // and %, prod/any/all/argmin, var/std,
cumsum/cumprod (the scan kernels), sort/argsort/topk (the bitonic sort kernel), linspace,
eye, dot and einsum, each lazy, eager and compiled against NumPy (float64, or the exact
integer result), with output allocations poisoned so an unwritten element fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gpk
import pygpukit.backends as backends

pytestmark = pytest.mark.gpu

FLOATS = ["float32", "float16", "bfloat16", "float64"]
INTS = ["int8", "uint8", "int32", "int64"]
ALL = FLOATS + INTS + ["bool"]
RTOL = {"float64": 1e-12, "float32": 3e-6, "float16": 2e-3, "bfloat16": 1.6e-2}
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(autouse=True)
def cuda() -> Iterator[Any]:
    b = backends.get_backend()
    if b.name != "cuda":
        pytest.skip("the CUDA backend is not active")
    b.poison = True
    yield b
    b.synchronize()


def npd(name: str) -> np.dtype:
    return BF16 if name == "bfloat16" else np.dtype(name)


def rand(seed: int, shape: tuple[int, ...], d: str, low: float = -3, high: float = 3) -> Any:
    rng = np.random.default_rng(seed)
    if d == "bool":
        return rng.random(shape) < 0.5
    if d in INTS:
        return rng.integers(0 if d == "uint8" else -9, 10, size=shape).astype(d)
    return rng.uniform(low, high, shape).astype(npd(d))


def modes(fn: Callable[..., Any], *arrays: np.ndarray) -> list[np.ndarray]:
    """fn's CUDA results lazy, eager and compiled (fn returns one array)."""
    lazy = fn(*[gpk.asarray(a) for a in arrays]).to_numpy()
    with gpk.eager():
        eager = fn(*[gpk.asarray(a) for a in arrays]).to_numpy()
    compiled = gpk.compile(fn)(*[gpk.asarray(a) for a in arrays]).to_numpy()
    return [lazy, eager, compiled]


def close(out: np.ndarray, ref: np.ndarray, d: str, factor: float = 8.0) -> None:
    assert out.shape == np.shape(ref), (out.shape, np.shape(ref))
    o64, r64 = np.asarray(out).astype(np.float64), np.asarray(ref).astype(np.float64)
    if d in RTOL:
        rtol = RTOL[d] * factor
        finite = np.isfinite(r64)
        scale = max(1.0, float(np.abs(r64[finite]).max()) if finite.any() else 1.0)
        np.testing.assert_allclose(o64, r64, rtol=rtol, atol=rtol * scale, equal_nan=True)
    else:
        np.testing.assert_array_equal(o64, r64)


def exact(out: np.ndarray, ref: np.ndarray) -> None:
    assert out.dtype == np.asarray(ref).dtype, (out.dtype, np.asarray(ref).dtype)
    np.testing.assert_array_equal(out.astype(np.float64), np.asarray(ref).astype(np.float64))


# -- // and % ---------------------------------------------------------------------------------


@pytest.mark.parametrize("d", ALL)
@pytest.mark.parametrize("op", ["floor_divide", "remainder"])
def test_floor_divide_and_remainder(d: str, op: str) -> None:
    x, y = rand(1, (7, 129), d, -20, 20), rand(2, (7, 129), d, -4, 4)
    if d != "bool":
        y[0, :6] = 0
    if d in ("int8", "int32", "int64"):
        x[1, 0], y[1, 0] = np.iinfo(d).min, -1
    if d in FLOATS:
        x[2, :4] = [np.inf, -np.inf, np.nan, -0.0]
    fn = np.floor_divide if op == "floor_divide" else np.remainder
    with np.errstate(all="ignore"):  # NumPy's own result in the kernels' compute precision
        if d in ("float16", "bfloat16"):
            want = fn(x.astype(np.float32), y.astype(np.float32)).astype(npd(d))
        else:
            want = fn(x, y)
    for out in modes(lambda a, b: getattr(gpk, op)(a, b), x, y):
        exact(out, want)
    fused = modes(lambda a, b: (a // b + a % b) * 1, x, y)[0] if d in FLOATS else None
    if fused is not None:
        cd = np.float64 if d == "float64" else np.float32  # the kernels' compute precision
        with np.errstate(all="ignore"):
            ref = (np.floor_divide(x.astype(cd), y.astype(cd))
                   + np.remainder(x.astype(cd), y.astype(cd)))  # fmt: skip
        close(fused, ref.astype(npd(d)), d)


# -- reductions -------------------------------------------------------------------------------


@pytest.mark.parametrize("d", ALL)
@pytest.mark.parametrize("op", ["prod", "any", "all", "argmin"])
def test_reductions(d: str, op: str) -> None:
    x = rand(3, (6, 300, 5), d)
    if d in FLOATS:
        x = (x / 16 + 1).astype(x.dtype)
        x[0, 3, 1] = 0
        x[1, 7, 2] = np.nan
    for axis in (None, 0, 1, -1, (0, 2)):
        if op == "argmin" and isinstance(axis, tuple):
            continue
        for keep in (False, True):
            x64 = x.astype(np.float64) if d in FLOATS else x
            want = getattr(np, op)(x64 if op != "argmin" else x, axis=axis, keepdims=keep)
            for out in modes(lambda a, axis=axis, keep=keep: getattr(gpk, op)(a, axis, keep), x):
                if op == "prod" and d in FLOATS:
                    close(out, want, d, 64)
                else:
                    exact(out, want.astype(np.int64) if op == "prod" else want)


@pytest.mark.parametrize("d", ALL)
def test_var_std(d: str) -> None:
    x = rand(4, (5, 1000, 3), d)
    x64 = x.astype(np.float64)
    for axis, ddof in ((None, 0), (1, 1), ((0, 2), 0)):
        for fn in ("var", "std"):
            want = getattr(np, fn)(x64, axis=axis, ddof=ddof)
            for out in modes(lambda a, axis=axis, ddof=ddof, fn=fn:
                             getattr(gpk, fn)(a, axis, ddof=ddof), x):  # fmt: skip
                # integers and bools give the default float, float32 (docs/dtypes.md)
                assert out.dtype == (x.dtype if d in FLOATS else np.float32)
                close(out, want, d if d in FLOATS else "float32", 64)
    far = (1e4 + rand(5, (4, 8192), "float32")).astype(np.float32)
    close(gpk.asarray(far).var(axis=1).to_numpy(), np.var(far.astype(np.float64), 1), "float32",
          300)  # fmt: skip


# -- scans ------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", ALL)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("shape", [(3, 7), (2, 5000), (1, 1), (4, 1000, 3)])
def test_scans(d: str, op: str, shape: tuple[int, ...]) -> None:
    x = rand(6, shape, d)
    if op == "cumprod" and d in FLOATS:
        x = (x / 64 + 1).astype(x.dtype)
    for axis in (None, 0, -1):
        x64 = x.astype(np.float64) if d in FLOATS else x
        want = getattr(np, op)(x64, axis=axis)
        n = shape[axis] if axis is not None else x.size
        for out in modes(lambda a, axis=axis: getattr(gpk, op)(a, axis), x):
            if d in FLOATS:
                assert out.dtype == x.dtype
                close(out, want, d, 4 * n**0.5 + 8)
            else:
                exact(out, want.astype(np.int64))


# -- sorts ------------------------------------------------------------------------------------


def sortable(d: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    x = rand(seed, shape, d)
    flat = x.reshape(-1)
    if d in FLOATS and flat.size > 5:
        flat[::7] = np.nan
        flat[3::11] = flat[5]
        flat[4::13] = -0.0
        flat[6::17] = np.inf
    return x


@pytest.mark.parametrize("d", ALL)
@pytest.mark.parametrize("shape", [(5, 37), (3, 4096), (2, 1), (7, 300, 2), (1, 16384)])
def test_sort_argsort(d: str, shape: tuple[int, ...]) -> None:
    x = sortable(d, shape, 7)
    key = x.astype(np.float32) if d == "bfloat16" else x
    for axis in (-1, 0):
        want = np.sort(key, axis=axis).astype(x.dtype)
        want_idx = np.argsort(key, axis=axis, kind="stable")
        for out in modes(lambda a, axis=axis: gpk.sort(a, axis), x):
            exact(out, want)
        for out in modes(lambda a, axis=axis: gpk.argsort(a, axis, kind="stable"), x):
            exact(out, want_idx)


@pytest.mark.parametrize("d", ["float32", "bfloat16", "float16", "int32", "uint8"])
@pytest.mark.parametrize(("k", "largest"), [(1, True), (10, True), (64, False), (300, True)])
def test_topk(d: str, k: int, largest: bool) -> None:
    x = sortable(d, (9, 300), 8)
    key = x.astype(np.float64)
    # torch.topk's order: best first, NaN the largest, equal values by lower index.
    if largest:
        order = np.argsort(np.where(np.isnan(key), -np.inf, -key), -1, kind="stable")
        nans = np.argsort(~np.isnan(np.take_along_axis(key, order, -1)), -1, kind="stable")
        order = np.take_along_axis(order, nans, -1)
    else:
        order = np.argsort(key, -1, kind="stable")
    want_i = order[:, :k]
    want_v = np.take_along_axis(x, want_i, -1)
    for part, want in ((0, want_v), (1, want_i)):
        for out in modes(lambda a, part=part: gpk.topk(a, k, -1, largest)[part], x):
            exact(out, want)


def test_sort_rows_past_one_block_raise_unsupported() -> None:
    x = gpk.asarray(rand(9, (2, 1 << 20), "float64"))
    with pytest.raises(gpk.errors.UnsupportedError, match="sort: rows of 1048576") as e:
        gpk.sort(x).to_numpy()
    assert isinstance(e.value, NotImplementedError)


# -- creation, dot, einsum --------------------------------------------------------------------


@pytest.mark.parametrize("d", ["float32", "bfloat16", "float64", "int32"])
def test_linspace_eye(d: str) -> None:
    for args in ((0, 1, 5), (-2.5, 7.25, 1001, False), (3, -1, 1), (0.1, 0.7, 50)):
        start, stop, num, *rest = args
        endpoint = rest[0] if rest else True
        want = np.linspace(start, stop, num, endpoint, dtype=npd(d) if d != "bfloat16"
                           else np.float64).astype(npd(d))  # fmt: skip

        def fn(start: Any = start, stop: Any = stop, num: Any = num, e: Any = endpoint) -> Any:
            return gpk.linspace(start, stop, num, e, d)

        for out in modes(fn):
            if d in FLOATS:  # the float64 multiply-add may fuse into one rounding on CUDA
                close(out, want, d, 1)
            else:
                exact(out, want)
    for n, m, k in ((3, None, 0), (4, 7, 2), (6, 3, -1)):
        for out in modes(lambda n=n, m=m, k=k: gpk.eye(n, m, k, d)):
            exact(out, np.eye(n, m, k, dtype=npd(d)))


@pytest.mark.parametrize("d", ["float32", "bfloat16", "float64", "int32"])
def test_dot_einsum(d: str) -> None:
    cases = [("dot", ((64,), (64,))), ("dot", ((2, 3, 64), (5, 64, 6))),
             ("dot", ((33, 64), (64, 17))), ("ij,jk->ik", ((33, 64), (64, 17))),
             ("bhqd,bhkd->bhqk", ((2, 4, 9, 64), (2, 4, 11, 64))),
             ("...ij,...jk", ((3, 5, 64), (64, 7))), ("ij,jk,kl->il", ((5, 6), (6, 7), (7, 8))),
             ("ij->", ((40, 50),)), ("abc,cd,bd->a", ((3, 4, 5), (5, 6), (4, 6)))]  # fmt: skip
    for spec, shapes in cases:
        ops = [rand(10 + i, s, d) for i, s in enumerate(shapes)]
        f64 = [o.astype(np.float64) if d in FLOATS else o for o in ops]
        if spec == "dot":
            want = np.dot(*f64)
            fn: Callable[..., Any] = gpk.dot
        else:
            want = np.einsum(spec, *f64)
            fn = lambda *a, spec=spec: gpk.einsum(spec, *a)  # noqa: E731
        for out in modes(fn, *ops):
            if d in FLOATS:
                close(out, want, d, 64)
            else:
                exact(out, want.astype(out.dtype))
