"""Differential fuzz: random small programs (elementwise ops with weak scalars, // and % of
integers, views and writes through them, basic indexing, reductions, scans and sorts;
attention with NaN and inf) run lazily, eagerly and compiled, against NumPy. Floats are
checked against a float64 reference rounded to the dtype after each step; ints and bools
exactly. Bounded to run in well under a minute on two cores."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
from attention_ref import sdpa_ref
from helpers import RTOL, np_dtype, rand
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pygpukit as gpk

DTYPES = ["float32", "float16", "bfloat16", "int8", "int32", "bool"]
MODES = ["lazy", "eager", "compiled"]
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


# -- programs ---------------------------------------------------------------------------------
# A step is (kind, args); `apply` runs it on an array `x` of either library, so the same
# code builds the pygpukit program and the NumPy reference. `fix` rounds the reference to
# the dtype after each step (float64 -> bf16/f16/f32), as the kernels round their results.


def _slices(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for n in shape:
        kind = draw(st.sampled_from(["full", "slice", "int"]))
        if kind == "int":
            out.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            start = draw(st.integers(-n, n))
            step = draw(st.sampled_from([1, 2, -1]))
            out.append(slice(start, None, step))
        else:
            out.append(slice(None))
    return tuple(out)


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, tuple[int, ...], list[tuple[str, Any]], str]:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    steps: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["scalar", "self", "view_write", "transpose_write",
                                     "reshape_write", "index_then_back", "unary"]))  # fmt: skip
        if kind == "scalar":
            # // and % of integers only: a float quotient near an integer floors either way
            # between the float64 reference and the dtype.
            int_ops = ["floordiv", "mod"] if dtype in ("int8", "int32") else []
            op = draw(st.sampled_from(["add", "mul", "max", *int_ops]))
            steps.append((kind, (op, draw(st.integers(-3, 3)))))
        elif kind == "self":
            steps.append((kind, draw(st.sampled_from(["add", "mul", "max"]))))
        elif kind in ("view_write", "transpose_write"):
            view_shape = shape if kind == "view_write" else shape[::-1]
            steps.append((kind, (_slices(draw, view_shape), draw(st.integers(-4, 4)))))
        elif kind == "reshape_write":
            steps.append((kind, (draw(st.integers(0, math.prod(shape) - 1)),
                                 draw(st.integers(-4, 4)))))  # fmt: skip
        elif kind == "index_then_back":
            steps.append((kind, _slices(draw, shape)))
        else:
            steps.append((kind, draw(st.sampled_from(["neg", "abs"]))))
    final = draw(st.sampled_from(["none", "sum", "max", "min", "sum_axis0", "argmin", "any",
                                  "all", "cumsum_axis0", "sort_axis0"]))  # fmt: skip
    return dtype, shape, steps, final


def _binary(op: str, a: Any, b: Any, xp: Any) -> Any:
    fns = {"add": xp.add, "mul": xp.multiply, "max": xp.maximum, "floordiv": xp.floor_divide,
           "mod": xp.mod}  # fmt: skip
    with np.errstate(all="ignore"):  # NumPy's int // 0 is 0 with a warning
        return fns[op](a, b)


def _is_bool(x: Any) -> bool:
    return x.dtype.name == "bool"  # numpy's dtype and gpk's DType both name it so


def apply(x: Any, steps: list[tuple[str, Any]], final: str, xp: Any, fix: Any) -> Any:
    for kind, args in steps:
        if kind == "scalar":
            op, c = args
            c = bool(c) if _is_bool(x) else c
            x = fix(_binary(op, x, c, xp))
        elif kind == "self":
            x = fix(_binary(args, x, x, xp))
        elif kind == "view_write":
            idx, c = args
            v = x[(*idx, Ellipsis)]  # a view even when every index is an int (0-d)
            v[...] = bool(c) if _is_bool(x) else c
        elif kind == "transpose_write":
            idx, c = args
            t = x.T
            t[idx] = bool(c) if _is_bool(x) else c
        elif kind == "reshape_write":
            k, c = args
            r = x.reshape(-1)  # a view of a contiguous array
            r[k] = bool(c) if _is_bool(x) else c
        elif kind == "index_then_back":
            y = x[args] * 1 if not _is_bool(x) else x[args] | False
            x = x * 1 if not _is_bool(x) else x | False  # a copy; y stays what it read
            v = x[(*args, Ellipsis)]
            v[...] = fix(y)
        elif args == "neg" and not _is_bool(x) and x.dtype.kind != "u":
            x = fix(-x)
        elif args == "abs" and not _is_bool(x):
            x = fix(xp.abs(x))
    if final == "sum":
        return x.sum()
    if final == "max":
        return x.max()
    if final == "min":
        return x.min()
    if final == "sum_axis0":
        return x.sum(axis=0)
    if final == "argmin":
        return x.argmin()
    if final in ("any", "all"):
        return getattr(x, final)()
    if final == "cumsum_axis0":
        return xp.cumsum(x, axis=0)
    if final == "sort_axis0":
        return xp.sort(x, axis=0)
    return x * 1 if not _is_bool(x) else x | False


def _reference(x: np.ndarray, dtype: str, steps: list, final: str) -> np.ndarray:
    if dtype in RTOL:  # floats: float64, rounded to the dtype after each step
        to = np_dtype(dtype)

        def fix(a: Any) -> Any:
            return np.asarray(a).astype(to).astype(np.float64)

        return np.asarray(apply(x.astype(np.float64), steps, final, np, fix))
    return np.asarray(apply(x.copy(), steps, final, np, lambda a: a))


def _run(mode: str, x: np.ndarray, steps: list, final: str) -> np.ndarray:
    def program(a: gpk.GPUArray) -> gpk.GPUArray:
        return apply(a, steps, final, gpk, lambda v: v)

    if mode == "compiled":
        return gpk.compile(program)(gpk.from_numpy(x)).to_numpy()
    with gpk.eager() if mode == "eager" else contextlib.nullcontext():
        return program(gpk.from_numpy(x)).to_numpy()


def _compare(out: np.ndarray, ref: np.ndarray, dtype: str, n: int) -> None:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if dtype not in RTOL:
        np.testing.assert_array_equal(out.astype(np.int64), ref.astype(np.int64))
        return
    out64 = out.astype(np.float64)
    # Each step rounds once in both; a sum of n terms accumulates n roundings.
    tol = RTOL[dtype] * 8 * max(1, n)
    scale = max(1.0, float(np.nanmax(np.abs(ref))) if ref.size else 1.0)
    np.testing.assert_allclose(out64, ref, rtol=tol, atol=tol * scale)


@given(prog=programs(), seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(MODES))
@FUZZ
def test_programs_match_numpy(prog, seed: int, mode: str) -> None:
    dtype, shape, steps, final = prog
    x = rand(np.random.default_rng(seed), shape, dtype)
    if dtype in ("float16", "bfloat16"):
        x = x.astype(np.float32).round(1).astype(np_dtype(dtype))  # few bits: exact inputs
    ref = _reference(x, dtype, steps, final)
    with np.errstate(all="ignore"):
        out = _run(mode, x, steps, final)
    _compare(np.asarray(out), ref, dtype, math.prod(shape))


# -- attention with NaN and inf ----------------------------------------------------------------


@st.composite
def attention_cases(draw: st.DrawFn) -> dict[str, Any]:
    sq, sk = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    kvh = draw(st.sampled_from([1, 2]))
    case: dict[str, Any] = {
        "dtype": draw(st.sampled_from(["float32", "float16", "bfloat16"])),
        "shapes": ((1, 2 * kvh, sq, 8), (1, kvh, sk, 8)),
        "causal": draw(st.booleans()),
        "scale": draw(st.sampled_from([None, None, 0.0, 0.3, math.nan])),
        "kv_len": draw(st.one_of(st.none(), st.integers(0, sk))),
        "poison": draw(
            st.lists(
                st.tuples(
                    st.sampled_from("qkv"),
                    st.sampled_from([math.nan, math.inf, -math.inf]),
                    st.integers(0, 10**6),
                ),
                max_size=2,
            )
        ),  # fmt: skip
    }
    return case


@given(case=attention_cases(), seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(MODES))
@FUZZ
def test_attention_with_nan_and_inf_matches_float64(case: dict, seed: int, mode: str) -> None:
    rng = np.random.default_rng(seed)
    dt = case["dtype"]
    qs, ks = case["shapes"]
    t = {"q": rand(rng, qs, dt, low=-1, high=1), "k": rand(rng, ks, dt, low=-1, high=1),
         "v": rand(rng, ks, dt, low=-1, high=1)}  # fmt: skip
    for which, value, pos in case["poison"]:
        t[which].reshape(-1)[pos % t[which].size] = value
    q, k, v = t["q"], t["k"], t["v"]
    kv_len = case["kv_len"]
    ref = sdpa_ref(q, k, v, causal=case["causal"], scale=case["scale"], kv_len=kv_len)
    dev = {} if kv_len is None else {"kv_len": gpk.asarray(np.array(kv_len, np.int32))}

    def attend(a: Any, b: Any, c: Any, **kw: Any) -> gpk.GPUArray:
        return gpk.nn.scaled_dot_product_attention(a, b, c, is_causal=case["causal"],
                                                   scale=case["scale"], **kw)  # fmt: skip

    args = [gpk.from_numpy(a) for a in (q, k, v)]
    if mode == "compiled":
        out = gpk.compile(attend)(*args, **dev).to_numpy()
    else:
        with gpk.eager() if mode == "eager" else contextlib.nullcontext():
            out = attend(*args, **dev).to_numpy()
    out = out.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    tol = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 6e-2}[dt]
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
