"""scaled_dot_product_attention's sliding window (window=w: the query at key-aligned
position p = i + kv_len - seq_q sees keys j > p - w) against the float64 reference, alone
and with causal, kv_len and kv_start, lazy and compiled on the current backend; hidden keys'
NaN never reaches the result; bad windows raise."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from attention_ref import sdpa_ref
from helpers import rand

import pygpukit as gpk
from pygpukit.ir.ops import infer
from pygpukit.ir.shapes import ShapeRuleError

sdpa = gpk.nn.scaled_dot_product_attention


def _run(compiled: bool, q: np.ndarray, k: np.ndarray, v: np.ndarray, **kw: Any) -> np.ndarray:
    dev = {n: gpk.asarray(x) for n, x in kw.items() if isinstance(x, np.ndarray)}
    host = {n: x for n, x in kw.items() if not isinstance(x, np.ndarray)}
    args = [gpk.from_numpy(t) for t in (q, k, v)]
    if compiled:
        f = gpk.compile(lambda a, b, c, **d: sdpa(a, b, c, **host, **d))
        return f(*args, **dev).to_numpy()
    return sdpa(*args, **host, **dev).to_numpy()


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize(("sq", "sk", "window", "causal", "kv_len", "kv_start"), [
    (7, 7, 3, True, None, None),
    (5, 12, 4, True, None, None),        # a chunk appended to a cache
    (6, 10, 2, False, None, None),       # window alone: only the lower edge
    (4, 12, 3, True, 9, None),           # aligned at kv_len
    (4, 12, 5, True, 9, [2, 6]),         # with left padding
    (9, 6, 2, True, None, None),         # more queries than keys: empty rows give zeros
    (3, 8, 100, True, None, None),       # wider than the sequence: hides nothing
])  # fmt: skip
def test_window_matches_reference(compiled: bool, sq: int, sk: int, window: int,
                                  causal: bool, kv_len: int | None,
                                  kv_start: list[int] | None) -> None:  # fmt: skip
    rng = np.random.default_rng(sq * 100 + sk + window)
    q = rand(rng, (2, 4, sq, 8), "float32")
    k, v = rand(rng, (2, 2, sk, 8), "float32"), rand(rng, (2, 2, sk, 8), "float32")
    kw: dict[str, Any] = {"is_causal": causal, "window": window}
    if kv_len is not None:
        kw["kv_len"] = np.array(kv_len, np.int64)
    if kv_start is not None:
        kw["kv_start"] = np.array(kv_start, np.int32)
    ref = sdpa_ref(q, k, v, causal=causal, kv_len=kv_len, kv_start=kv_start, window=window)
    out = _run(compiled, q, k, v, **kw)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    if window < sk:  # the window changes the result: it is applied, not ignored
        plain = sdpa_ref(q, k, v, causal=causal, kv_len=kv_len, kv_start=kv_start)
        assert not np.allclose(plain, ref)


def test_window_hides_nan_outside_it() -> None:
    rng = np.random.default_rng(5)
    q = rand(rng, (1, 2, 6, 8), "float32")
    k, v = rand(rng, (1, 2, 6, 8), "float32"), rand(rng, (1, 2, 6, 8), "float32")
    k[0, 1, 0, 2] = math.nan  # key 0: outside the window of queries 2.. (window 2)
    v[0, 0, 0, 3] = math.inf
    out = _run(False, q, k, v, is_causal=True, window=2)
    ref = sdpa_ref(q, k, v, causal=True, window=2)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.isfinite(out[:, :, 2:]).all()  # queries whose window excludes key 0
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("window", "exc"), [(0, ValueError), (-3, ValueError),
                                             (2.5, TypeError), (True, TypeError)])  # fmt: skip
def test_bad_window_raises(window: Any, exc: type) -> None:
    x = gpk.from_numpy(np.ones((1, 1, 2, 4), np.float32))
    with pytest.raises(exc, match="scaled_dot_product_attention: window"):
        sdpa(x, x, x, window=window)


def test_ir_rule_checks_window() -> None:
    spec = ((1, 2, 3, 8), gpk.float32)
    with pytest.raises(ShapeRuleError, match="window"):
        infer("sdpa", [spec, spec, spec], {"window": 0})
    assert infer("sdpa", [spec, spec, spec], {"window": 4}) == ((1, 2, 3, 8), gpk.float32)
