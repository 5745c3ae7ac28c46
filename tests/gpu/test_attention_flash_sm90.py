"""The Hopper prefill kernel (attention_flash_sm90.cuh: wgmma, tensor-map copies) against
the float64 reference on SM 9.0 devices (skipped elsewhere): random shapes through sdpa
(the planner takes it there for PREFERRED_HEAD_DIMS) over batch, GQA groups, lengths no
multiple of its 128-row / 128-key tiles, chunk offsets (fewer queries than keys), bf16 /
f16, causal or not, device kv_len / kv_start and the sliding window; straight launches
with strided q and one K / V shared by the batch, head dims 64 and 128; a NaN in a hidden
V row never leaks; a compiled (graph-captured) step replays with new lengths."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from attention_ref import sdpa_case_inputs, sdpa_cases, sdpa_ref
from helpers import rand
from hypothesis import HealthCheck, given, settings

import pygpukit as gpk
from pygpukit.backends.cuda.kernels import attention, attention_sm90, loader

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

sdpa = gpk.nn.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def _hopper() -> None:
    if not attention_sm90.available():
        pytest.skip("attention_flash_sm90 runs on SM 9.0 devices only")


def _close(out: Any, ref: np.ndarray) -> None:
    out = np.asarray(out, np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2)


def _sm90_used() -> bool:
    return any(key[0] == attention_sm90.FAMILY for key in loader._modules)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    sdpa_cases(batch=2, queries=(2, 300), keys=400, head_dims=attention_sm90.PREFERRED_HEAD_DIMS)
)
def test_sm90_matches_reference(c: dict[str, Any]) -> None:
    q, k, v, kw = sdpa_case_inputs(c)
    dev: dict[str, Any] = {}
    if c["kv_len"] is not None:
        dev["kv_len"] = gpk.asarray(np.array(c["kv_len"], np.int32))
    if c["kv_start"] is not None:
        dev["kv_start"] = gpk.asarray(np.array(c["kv_start"], np.int64))
    args = [gpk.from_numpy(t) for t in (q, k, v)]
    out = sdpa(*args, is_causal=c["causal"], window=c["window"], **dev).to_numpy()
    _close(out, sdpa_ref(q, k, v, **kw))
    assert _sm90_used()


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shared_kv", [False, True])
def test_sm90_launch(d: int, dtype: str, shared_kv: bool) -> None:
    """attention_sm90.flash_sm90 on torch buffers: 2 x 8 heads over 4 kv heads, 300 queries
    against 333 keys, causal with kv_len, kv_start and a window, strided q ([B, S, H, D]
    viewed as [B, H, S, D]), and (shared_kv) one K / V for both batch rows."""
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    rng = np.random.default_rng(d + int(shared_kv))
    b, h, kvh, sq, sk = 2, 8, 4, 300, 333
    kb = 1 if shared_kv else b
    q = rand(rng, (b, sq, h, d), dtype)
    k, v = rand(rng, (kb, kvh, sk, d), dtype), rand(rng, (kb, kvh, sk, d), dtype)
    kv_len, kv_start, window = 320, [0, 37], 100
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to("cuda", tdt) for x in (q, k, v))
    to = torch.empty(b, h, sq, d, device="cuda", dtype=tdt)
    tl = torch.tensor(kv_len, dtype=torch.int32, device="cuda")
    ts = torch.tensor(kv_start, dtype=torch.int64, device="cuda")
    masks = attention.Masks(kv_len=tl.data_ptr(), kv_start=ts.data_ptr(),
                            kv_start_dtype="int64", window=window)  # fmt: skip
    kvs = (0, sk * d, d) if shared_kv else None
    attention_sm90.flash_sm90(tq.data_ptr(), tk.data_ptr(), tv.data_ptr(), to.data_ptr(), b, h,
                              kvh, sq, sk, d, dtype, causal=True, masks=masks,
                              q_strides=(sq * h * d, d, h * d), k_strides=kvs, v_strides=kvs,
                              kv_batch=kb)  # fmt: skip
    torch.cuda.synchronize()
    kr, vr = (np.broadcast_to(x, (b,) + x.shape[1:]) for x in (k, v))
    ref = sdpa_ref(q.transpose(0, 2, 1, 3), kr, vr, causal=True, kv_len=kv_len,
                   kv_start=kv_start, window=window)  # fmt: skip
    _close(to.float().cpu().numpy(), ref)


@pytest.mark.parametrize("where", ["causal", "window", "kv_len", "kv_start"])
def test_sm90_hidden_nan_does_not_leak(where: str) -> None:
    """NaN / inf in V rows a query may not see (the copy engine loads them as they are):
    the causal diagonal hides key 170 from queries 0..169 of a 200 x 200 causal attention;
    a window of 8 hides key 20 from queries 28..; kv_len 190 the tail; kv_start the head."""
    rng = np.random.default_rng(3)
    b, h, kvh, s, d = 2, 4, 2, 200, max(attention_sm90.PREFERRED_HEAD_DIMS)
    q = rand(rng, (b, h, s, d), "bfloat16")
    k, v = rand(rng, (b, kvh, s, d), "bfloat16"), rand(rng, (b, kvh, s, d), "bfloat16")
    kw: dict[str, Any] = {"causal": True}
    dev: dict[str, Any] = {}
    if where == "causal":
        v[:, :, 170, 5] = np.nan
        v[1, 0, 171, 9] = np.inf
    elif where == "window":
        kw["window"] = 8
        v[:, :, 20, 3] = np.nan
    elif where == "kv_len":
        kw["kv_len"] = 190
        k[:, :, 190:] = np.nan
        v[:, :, 190:] = np.nan
        dev["kv_len"] = gpk.asarray(np.array(190, np.int32))
    else:
        kw["kv_start"] = [13, 0]
        k[0, :, :13] = np.nan
        v[0, :, :13] = np.inf
        dev["kv_start"] = gpk.asarray(np.array([13, 0], np.int32))
    ref = sdpa_ref(q, k, v, **kw)
    args = [gpk.from_numpy(t) for t in (q, k, v)]
    out = sdpa(*args, is_causal=True, window=kw.get("window"), **dev).to_numpy()
    _close(out, ref)
    assert _sm90_used()
    if where == "causal":
        assert np.isfinite(out[:, :, :170]).all() and np.isnan(out[:, :, 170:, 5]).all()


def test_sm90_compiled_replays_with_new_lengths() -> None:
    """A compiled (graph-captured) chunk of 150 queries against a 400-key cache, replayed
    with new kv_len / kv_start values read on the device (the tensor maps are the
    capture's, as the pointers are)."""
    rng = np.random.default_rng(6)
    q = rand(rng, (2, 8, 150, 128), "bfloat16")
    k, v = rand(rng, (2, 2, 400, 128), "bfloat16"), rand(rng, (2, 2, 400, 128), "bfloat16")
    f = gpk.compile(lambda a, b, c, n, s: sdpa(a, b, c, is_causal=True, kv_len=n, kv_start=s))
    args = [gpk.from_numpy(t) for t in (q, k, v)]
    for n, st_ in ((150, [0, 5]), (300, [17, 0]), (400, [3, 100])):
        out = f(*args, gpk.asarray(np.array(n, np.int32)), gpk.asarray(np.array(st_, np.int32)))
        ref = sdpa_ref(q, k, v, causal=True, kv_len=n, kv_start=st_)
        _close(out.to_numpy(), ref)
    assert _sm90_used()
