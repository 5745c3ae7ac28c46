"""The CUDA attention kernels let NaN and inf through as the float64 reference does:
prefill (hd 64/128, no masks), decode (one query row, kv_len, many splits), and the
composed fallback (hd 40, masks). Fully masked rows keep giving zeros; a row whose visible
scores are all -inf gives NaN, as the reference does. A bad device-held
kv_len / kv_start read by a decode kernel or the composed path is an index error."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from attention_ref import sdpa_ref
from helpers import RTOL, rand

import pygpukit as gpk

sdpa = gpk.nn.scaled_dot_product_attention


def _check(out: Any, ref: np.ndarray) -> None:
    out = np.asarray(out, np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("hd", "sq", "sk", "kw"), [
    (64, 9, 13, {}), (128, 40, 40, {"is_causal": True}),        # prefill kernel
    (64, 1, 4096, {"kv_len": 3000}), (128, 1, 300, {}),         # decode kernel, splits
    (40, 5, 11, {"kv_len": 9, "is_causal": True}),              # composed fallback
])  # fmt: skip
@pytest.mark.parametrize("where", ["q", "k", "v", "scale", "k_all", "q_neg_inf"])
def test_nan_propagates(cuda: Any, hd: int, sq: int, sk: int, kw: dict, where: str) -> None:
    rng = np.random.default_rng(hd + sq + sk)
    q = rand(rng, (2, 4, sq, hd), "float16")
    k, v = rand(rng, (2, 2, sk, hd), "float16"), rand(rng, (2, 2, sk, hd), "float16")
    scale = None
    if where == "q":
        q[0, 1, sq - 1, 3] = np.nan
    elif where == "k":
        k[1, 0, 0, 5] = np.nan
    elif where == "v":
        v[0, 1, 0, 2] = np.inf
    elif where == "k_all":  # every score of a head NaN: max stays -inf, the NaN must not
        k[1, 1] = np.nan
    elif where == "q_neg_inf":  # every score of a row -inf: exp(-inf - -inf) is NaN, not 0
        q[0, 1, sq - 1, 3] = -np.inf
        k[0, 0, :, 3] = np.abs(k[0, 0, :, 3]) + 0.25
    else:
        scale = math.nan
    n = kw.get("kv_len")
    if n is not None:
        k[:, :, n:] = np.nan  # past kv_len: absent, never read into the result
        v[:, :, n:] = np.nan
    causal = kw.get("is_causal", False)
    ref = sdpa_ref(q, k, v, causal=causal, scale=scale, kv_len=n)
    dev = {} if n is None else {"kv_len": gpk.asarray(np.array(n, np.int32))}
    out = sdpa(gpk.from_numpy(q), gpk.from_numpy(k), gpk.from_numpy(v), is_causal=causal,
               scale=scale, **dev)  # fmt: skip
    _check(out.to_numpy(), ref)


def test_zero_scale_and_empty_rows(cuda: Any) -> None:
    rng = np.random.default_rng(1)
    q = rand(rng, (1, 2, 20, 64), "float32")
    k, v = rand(rng, (1, 2, 16, 64), "float32"), rand(rng, (1, 2, 16, 64), "float32")
    out = sdpa(gpk.from_numpy(q), gpk.from_numpy(k), gpk.from_numpy(v), is_causal=True,
               scale=0.0).to_numpy()  # fmt: skip
    _check(out, sdpa_ref(q, k, v, causal=True, scale=0.0))
    assert np.all(out[:, :, :4] == 0)  # rows that see no key


# (head_dim, dtype, key length): the decode kernels (sq == 1), one split and several.
_DECODE_CASES = [
    (64, "float32", 64), (64, "float32", 4096),        # CUDA-core pgk_attn_decode_split
    (128, "bfloat16", 64), (128, "bfloat16", 4096),    # tensor-core pgk_attn_decode_mma
]  # fmt: skip


# The composed path (head dim 40; query chunks against a cache) checks them in a kernel of
# its own before its masks.
_LENGTH_CASES = [(*c, 1) for c in _DECODE_CASES] + [(40, "float32", 11, 5), (40, "float16", 300, 7)]


@pytest.mark.parametrize(("hd", "dtype", "sk", "sq"), _LENGTH_CASES)
@pytest.mark.parametrize(("name", "bad"), [("kv_len", -1), ("kv_len", 1), ("kv_start", 1),
                                           ("kv_start", -1)])  # fmt: skip
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_bad_device_lengths_are_value_errors(cuda: Any, hd: int, dtype: str, sk: int, sq: int,
                                             name: str, bad: int,
                                             index_dtype: Any) -> None:  # fmt: skip
    """A device-held kv_len outside [0, seq] or kv_start outside [0, seq] (bad = 1 means
    seq + 1) is read by the decode kernel (or the composed path's check), recorded in the
    error word and raised at the next sync as a ValueError (as the host check raises) naming
    the op, the length and this line; the next good call is unaffected."""
    from pygpukit.backends.cuda.kernels import attention

    rng = np.random.default_rng(hd + sk)
    if sq == 1:
        splits = attention.decode_splits(2, 4, 2, sk, dtype)
        assert (splits > 1) == (sk > 64)  # both the one-split and the split paths are covered
    q = rand(rng, (2, 4, sq, hd), dtype)
    k, v = rand(rng, (2, 2, sk, hd), dtype), rand(rng, (2, 2, sk, hd), dtype)
    value = sk + 1 if bad == 1 else bad
    good_len, good_start = sk - 7, np.array([0, 3])
    lens = {"kv_len": good_len, "kv_start": good_start}
    lens[name] = value if name == "kv_len" else np.array([0, value])
    qd, kd, vd = gpk.from_numpy(q), gpk.from_numpy(k), gpk.from_numpy(v)

    def call(n: Any, st: Any) -> Any:
        return sdpa(qd, kd, vd, kv_len=gpk.asarray(np.array(n, index_dtype)),
                    kv_start=gpk.asarray(np.asarray(st, index_dtype)))  # fmt: skip

    with pytest.raises(gpk.errors.GPUKitValueError) as e:
        call(lens["kv_len"], lens["kv_start"]).to_numpy()
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and f"sdpa: {name} {value} is outside" in msg
    assert "test_attention_nan_gpu.py" in msg
    out = call(good_len, good_start).to_numpy()
    ref = sdpa_ref(q, k, v, kv_len=good_len, kv_start=good_start)
    f = 10 if dtype == "bfloat16" else 50  # as test_cuda_ops' decode tests
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=RTOL[dtype] * f,
                               atol=RTOL[dtype] * 2 * f)  # fmt: skip
