"""The tensor-core prefill kernel (attention_flash.cuh) against the float64 reference:
random shapes (hypothesis) over batch, heads, GQA groups, lengths that are no multiple of
its tiles, head dims 64 / 128, bf16 / f16, causal, device kv_len / kv_start and the sliding
window; every block geometry through the launcher; a NaN / inf in a hidden V row never
leaks (causal diagonal, window edge, kv_len tail, kv_start head) while one in a visible
element propagates; a bad device kv_len / kv_start is an index error. The float32 CUDA-core
kernel takes the same masks and NaN cases."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from attention_ref import sdpa_case_inputs, sdpa_cases, sdpa_ref
from helpers import rand
from hypothesis import HealthCheck, given, settings

import pygpukit as gpk
from pygpukit.backends.cuda.kernels import attention, loader

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

sdpa = gpk.nn.scaled_dot_product_attention


def _close(out: Any, ref: np.ndarray, dtype: str) -> None:
    out = np.asarray(out, np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    tol = 1e-4 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)


def _flash_used() -> bool:
    # attention_flash_sm90 is the planner's choice on SM 9.0 devices.
    return any(key[0] in ("attention_flash", "attention_flash_sm90") for key in loader._modules)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool,
            kv_len: int | None = None, kv_start: list[int] | None = None,
            window: int | None = None, scale: float | None = None,
            index_dtype: Any = np.int32, compiled: bool = False) -> np.ndarray:  # fmt: skip
    dev: dict[str, Any] = {}
    if kv_len is not None:
        dev["kv_len"] = gpk.asarray(np.array(kv_len, index_dtype))
    if kv_start is not None:
        dev["kv_start"] = gpk.asarray(np.array(kv_start, index_dtype))
    args = [gpk.from_numpy(t) for t in (q, k, v)]
    if compiled:
        f = gpk.compile(lambda a, b, c, **d: sdpa(a, b, c, is_causal=causal, scale=scale,
                                                  window=window, **d))  # fmt: skip
        return f(*args, **dev).to_numpy()
    return sdpa(*args, is_causal=causal, scale=scale, window=window, **dev).to_numpy()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(sdpa_cases(batch=3, queries=(1, 150), keys=220, head_dims=(64, 128)))
def test_flash_matches_reference(c: dict[str, Any]) -> None:
    q, k, v, kw = sdpa_case_inputs(c)
    out = _attend(q, k, v, **kw)
    _close(out, sdpa_ref(q, k, v, **kw), c["dtype"])
    if c["sq"] > 1 or c["window"]:  # one query row without a window: the decode kernel
        assert _flash_used()


def _flash_direct(q: np.ndarray, k: np.ndarray, v: np.ndarray, dtype: str,
                  geometry: tuple[int, ...], kv_len: int, kv_start: list[int],
                  window: int) -> np.ndarray:  # fmt: skip
    """attention.flash on torch buffers with this geometry: q [B, S, H, D] viewed as
    [B, H, S, D] (strided), causal, device kv_len (int32) and kv_start (int64)."""
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    b, sq, h, d = q.shape
    kvh, sk = k.shape[1:3]
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to("cuda", tdt) for x in (q, k, v))
    to = torch.empty(b, h, sq, d, device="cuda", dtype=tdt)
    tl = torch.tensor(kv_len, dtype=torch.int32, device="cuda")
    ts = torch.tensor(kv_start, dtype=torch.int64, device="cuda")
    masks = attention.Masks(kv_len=tl.data_ptr(), kv_start=ts.data_ptr(),
                            kv_start_dtype="int64", window=window)  # fmt: skip
    attention.flash(tq.data_ptr(), tk.data_ptr(), tv.data_ptr(), to.data_ptr(), b, h, kvh, sq,
                    sk, d, dtype, causal=True, masks=masks,
                    q_strides=(sq * h * d, d, h * d), geometry=geometry)  # fmt: skip
    torch.cuda.synchronize()
    return np.asarray(to.float().cpu().numpy(), np.float64)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("geometry", attention.FLASH_SWEEP)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_geometry(d: int, geometry: tuple[int, int], dtype: str) -> None:
    """Each (warps, row tiles) the launcher can pick, straight through attention.flash on
    torch buffers: 2 x 8 heads over 4 kv heads, 300 queries against 333 keys, causal with
    kv_len, kv_start, a window, and strided (non-contiguous) q."""
    rng = np.random.default_rng(d + geometry[0] * 10 + geometry[1])
    b, h, kvh, sq, sk = 2, 8, 4, 300, 333
    q = rand(rng, (b, sq, h, d), dtype)  # [B, S, H, D] viewed as [B, H, S, D]
    k, v = rand(rng, (b, kvh, sk, d), dtype), rand(rng, (b, kvh, sk, d), dtype)
    kv_len, kv_start, window = 320, [0, 37], 100
    out = _flash_direct(q, k, v, dtype, geometry, kv_len, kv_start, window)
    ref = sdpa_ref(q.transpose(0, 2, 1, 3), k, v, causal=True, kv_len=kv_len,
                   kv_start=kv_start, window=window)  # fmt: skip
    _close(out, ref, dtype)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("geometry", attention.FLASH_SWEEP)
def test_every_geometry_hidden_nan(d: int, geometry: tuple[int, int]) -> None:
    """The scalar P V of a tile that hides a non-finite V row from some of its rows, in
    every geometry (sdpa picks the one-row-tile geometry for small grids only): with
    kv_len 320 of 300 queries and a window of 100, query i sees keys (i - 80, i + 20], so
    the NaN in V row 200 reaches queries 180..279 only and the inf in row 250 (batch 1,
    head 2) queries 230..299."""
    rng = np.random.default_rng(d + geometry[0] * 10 + geometry[1] + 1)
    b, h, kvh, sq, sk = 2, 8, 4, 300, 333
    q = rand(rng, (b, sq, h, d), "bfloat16")
    k, v = rand(rng, (b, kvh, sk, d), "bfloat16"), rand(rng, (b, kvh, sk, d), "bfloat16")
    v[:, :, 200, 5] = np.nan
    v[1, 2, 250, 9] = np.inf
    kv_len, kv_start, window = 320, [0, 37], 100
    out = _flash_direct(q, k, v, "bfloat16", geometry, kv_len, kv_start, window)
    ref = sdpa_ref(q.transpose(0, 2, 1, 3), k, v, causal=True, kv_len=kv_len,
                   kv_start=kv_start, window=window)  # fmt: skip
    _close(out, ref, "bfloat16")
    assert np.isnan(out[:, :, 180:280, 5]).all()
    assert not np.isnan(out[:, :, :180]).any() and not np.isnan(out[:, :, 280:]).any()
    assert np.isinf(out[1, 4:6, 230:300, 9]).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("where", ["causal", "window", "kv_len", "kv_start"])
def test_hidden_nan_does_not_leak(dtype: str, where: str) -> None:
    """NaN and inf in V (and K) rows a query may not see: the causal diagonal tile hides
    key 70 from queries 0..69 of a 100 x 100 causal attention; a window of 8 hides key 20
    from queries 28..; kv_len 90 hides the tail; kv_start hides the head."""
    rng = np.random.default_rng(3)
    b, h, kvh, s, d = 2, 4, 2, 100, 64
    q = rand(rng, (b, h, s, d), dtype)
    k, v = rand(rng, (b, kvh, s, d), dtype), rand(rng, (b, kvh, s, d), dtype)
    kw: dict[str, Any] = {"causal": True}
    if where == "causal":
        v[:, :, 70, 5] = np.nan
        v[1, 0, 71, 9] = np.inf
    elif where == "window":
        kw["window"] = 8
        v[:, :, 20, 3] = np.nan
    elif where == "kv_len":
        kw["kv_len"] = 90
        k[:, :, 90:] = np.nan
        v[:, :, 90:] = np.nan
    else:
        kw["kv_start"] = [13, 0]
        k[0, :, :13] = np.nan
        v[0, :, :13] = np.inf
    ref = sdpa_ref(q, k, v, **kw)
    out = _attend(q, k, v, **kw)
    _close(out, ref, dtype)
    if where == "causal":
        assert np.isfinite(out[:, :, :70]).all() and np.isnan(out[:, :, 70:, 5]).all()
    elif where == "window":
        assert np.isfinite(out[:, :, 28:]).all() and np.isnan(out[:, :, 20:28, 3]).all()
    else:
        assert np.isfinite(out).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("where", ["q", "k", "v", "scale"])
def test_visible_nan_propagates(dtype: str, where: str) -> None:
    rng = np.random.default_rng(4)
    q = rand(rng, (1, 4, 77, 128), dtype)
    k, v = rand(rng, (1, 2, 90, 128), dtype), rand(rng, (1, 2, 90, 128), dtype)
    scale = None
    if where == "q":
        q[0, 1, 40, 3] = np.nan
    elif where == "k":
        k[0, 0, 10, 5] = np.nan
    elif where == "v":
        v[0, 1, 30, 2] = np.inf
    else:
        scale = math.nan
    ref = sdpa_ref(q, k, v, causal=True, scale=scale)
    _close(_attend(q, k, v, causal=True, scale=scale), ref, dtype)


def test_compiled_replays_with_new_lengths() -> None:
    """A compiled (graph-captured) chunk of 48 queries against a 256-key cache, replayed
    with new kv_len / kv_start values read on the device."""
    rng = np.random.default_rng(6)
    q = rand(rng, (2, 8, 48, 64), "bfloat16")
    k, v = rand(rng, (2, 2, 256, 64), "bfloat16"), rand(rng, (2, 2, 256, 64), "bfloat16")
    f = gpk.compile(lambda a, b, c, n, s: sdpa(a, b, c, is_causal=True, kv_len=n, kv_start=s,
                                               window=64))  # fmt: skip
    args = [gpk.from_numpy(t) for t in (q, k, v)]
    for n, st_ in ((48, [0, 5]), (200, [17, 0]), (256, [3, 100])):
        out = f(*args, gpk.asarray(np.array(n, np.int32)), gpk.asarray(np.array(st_, np.int32)))
        ref = sdpa_ref(q, k, v, causal=True, kv_len=n, kv_start=st_, window=64)
        _close(out.to_numpy(), ref, "bfloat16")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(("name", "bad"), [("kv_len", 97), ("kv_len", -1), ("kv_start", 97),
                                           ("kv_start", -2)])  # fmt: skip
def test_bad_device_lengths_are_value_errors(dtype: str, name: str, bad: int) -> None:
    rng = np.random.default_rng(7)
    q = rand(rng, (2, 4, 20, 64), dtype)
    k, v = rand(rng, (2, 2, 96, 64), dtype), rand(rng, (2, 2, 96, 64), dtype)
    kw: dict[str, Any] = {"kv_len": 50} if name == "kv_start" else {"kv_start": [0, 3]}
    kw[name] = bad if name == "kv_len" else [0, bad]
    with pytest.raises(ValueError, match=f"{name} {bad} is outside") as info:
        _attend(q, k, v, causal=True, **kw)
    assert isinstance(info.value, gpk.GPUKitError)  # as the host check of a length raises
    ok = _attend(q, k, v, causal=True, kv_len=50, kv_start=[0, 3])  # the backend goes on
    _close(ok, sdpa_ref(q, k, v, causal=True, kv_len=50, kv_start=[0, 3]), dtype)
