"""scaled_dot_product_attention against the float64 reference with NaN and inf: NaN in a
visible q, k or v element (or a NaN scale) propagates, masked keys never reach the result,
a query that sees no key gets zeros; scale=0.0 is a scale; bad lengths raise. Lazy, eager
and compiled on the current backend."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import pytest
from attention_ref import sdpa_ref
from helpers import rand

import pygpukit as gpk

sdpa = gpk.nn.scaled_dot_product_attention


def _run(mode: str, q, k, v, **kw: Any) -> np.ndarray:
    dev = {n: gpk.asarray(x) for n, x in kw.items() if isinstance(x, np.ndarray)}
    host = {n: x for n, x in kw.items() if not isinstance(x, np.ndarray)}
    args = [gpk.from_numpy(t) for t in (q, k, v)]
    if mode == "compiled":
        f = gpk.compile(lambda a, b, c, **d: sdpa(a, b, c, **host, **d))
        return f(*args, **dev).to_numpy()
    with gpk.eager() if mode == "eager" else contextlib.nullcontext():
        return sdpa(*args, **host, **dev).to_numpy()


def _check(out: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def _inputs(seed: int, sq: int = 3, sk: int = 6) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rand(rng, (2, 4, sq, 8), "float32"), rand(rng, (2, 2, sk, 8), "float32"),
            rand(rng, (2, 2, sk, 8), "float32"))  # fmt: skip


def _poke(t: np.ndarray, idx: tuple[int, ...], value: float) -> np.ndarray:
    t = t.copy()
    t[idx] = value
    return t


CASES = {
    "nan_q": lambda q, k, v: ((_poke(q, (0, 1, 2, 3), math.nan), k, v), {}),
    "inf_q": lambda q, k, v: ((_poke(q, (1, 0, 0, 0), math.inf), k, v), {}),
    "nan_k_visible": lambda q, k, v: ((q, _poke(k, (0, 1, 2, 5), math.nan), v), {}),
    "inf_k": lambda q, k, v: ((q, _poke(k, (1, 0, 4, 0), -math.inf), v), {}),
    "nan_v": lambda q, k, v: ((q, k, _poke(v, (0, 0, 1, 2), math.nan)), {}),
    "inf_v": lambda q, k, v: ((q, k, _poke(v, (1, 1, 0, 7), math.inf)), {}),
    "nan_k_causal_masked": lambda q, k, v: ((q, _poke(k, (0, 0, 5, 1), math.nan), v),
                                            {"is_causal": True}),
    "nan_v_past_kv_len": lambda q, k, v: ((q, k, _poke(v, (0, 1, 5, 1), math.nan)),
                                          {"kv_len": np.array(4)}),
    "nan_k_before_kv_start": lambda q, k, v: ((q, _poke(k, (1, 0, 0, 1), math.nan), v),
                                              {"kv_start": np.array([0, 2])}),
    "nan_scale": lambda q, k, v: ((q, k, v), {"scale": math.nan}),
    "zero_scale": lambda q, k, v: ((q, k, v), {"scale": 0.0}),
    "inf_scale": lambda q, k, v: ((q, k, v), {"scale": math.inf}),
    "no_visible_key": lambda q, k, v: ((q, k, _poke(v, (0, 0, 0, 0), math.nan)),
                                       {"kv_len": np.array(0)}),
}  # fmt: skip


@pytest.mark.parametrize("mode", ["lazy", "eager", "compiled"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_nan_inf_matches_float64(case: str, mode: str) -> None:
    (q, k, v), kw = CASES[case](*_inputs(7))
    ref = sdpa_ref(q, k, v, causal=kw.get("is_causal", False), scale=kw.get("scale"),
                   kv_len=kw.get("kv_len"), kv_start=kw.get("kv_start"))  # fmt: skip
    _check(_run(mode, q, k, v, **kw), ref)


def test_zero_scale_is_uniform_attention() -> None:
    q, k, v = _inputs(8)
    out = _run("lazy", q, k, v, scale=0.0)
    uniform = np.repeat(v.astype(np.float64).mean(-2, keepdims=True), 2, 1).repeat(3, -2)
    np.testing.assert_allclose(out, uniform, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["lazy", "eager", "compiled"])
@pytest.mark.parametrize(("name", "value"), [("kv_len", -1), ("kv_len", 7), ("kv_start", [0, 7]),
                                             ("kv_start", [-1, 0])])  # fmt: skip
def test_bad_lengths_raise(name: str, value: Any, mode: str) -> None:
    q, k, v = _inputs(9)
    # A host value is checked at the call; a device array where it is read.
    with pytest.raises(gpk.GPUKitError) as err:
        sdpa(gpk.from_numpy(q), gpk.from_numpy(k), gpk.from_numpy(v), **{name: value})
    assert isinstance(err.value, ValueError) and name in str(err.value)
    assert "test_attention_nan.py" in str(err.value)
    with pytest.raises(gpk.GPUKitError) as err:
        _run(mode, q, k, v, **{name: np.array(value)})
    assert isinstance(err.value, ValueError) and name in str(err.value)


def test_bad_scale_type_raises() -> None:
    q, k, v = (gpk.from_numpy(t) for t in _inputs(10))
    with pytest.raises(gpk.DTypeError) as err:
        sdpa(q, k, v, scale="0.5")
    assert "scale" in str(err.value) and "test_attention_nan.py" in str(err.value)
