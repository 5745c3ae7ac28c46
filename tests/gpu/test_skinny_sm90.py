"""The Hopper skinny GEMM of batched decode (skinny_sm90.cuh: wgmma, tensor-map copies,
split K over a cluster or through L2) against float64 NumPy on SM 9.0 devices
(skipped elsewhere): straight launches over 17..128 token rows on the TinyLlama shapes and
odd ones (N, K no multiple of the 64-row / 64-column tiles, strided x), with and without the
residual, the SwiGLU epilogue, each swept geometry; and linears compiled through the
planner (plain, residual, RMSNorm + gate|up + SwiGLU) taking it for 64 rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.backends.cuda.kernels import loader, skinny_sm90
from pygpukit.errors import ShapeError

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]


@pytest.fixture(autouse=True)
def _hopper() -> None:
    if not skinny_sm90.available():
        pytest.skip("skinny_sm90 runs on SM 9.0 devices only")


def _silu(a: np.ndarray) -> np.ndarray:
    return a / (1 + np.exp(-a))


def _run(rng: np.random.Generator, m: int, n: int, k: int, dtype: str = "bfloat16", *,
         residual: bool = False, glu: bool = False, x_pad: int = 0,
         config: skinny_sm90.Config | None = None) -> None:  # fmt: skip
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    xs = k + x_pad
    x64 = rng.standard_normal((m, xs))
    w64 = rng.standard_normal((n, k)) * k**-0.5
    n_out = n // 2 if glu else n
    r64 = rng.standard_normal((m, n_out))
    tx = torch.from_numpy(x64).to("cuda", tdt)
    tw = torch.from_numpy(w64).to("cuda", tdt)
    tr = torch.from_numpy(r64).to("cuda", tdt)
    ty = torch.full((m, n_out), float("nan"), device="cuda", dtype=tdt)
    floats = skinny_sm90.workspace_floats(m, n, k, glu, config)
    work = torch.empty(max(floats, 4), device="cuda", dtype=torch.float32)
    ctr = torch.zeros(skinny_sm90.counters_needed(n, glu, config), device="cuda",
                      dtype=torch.int32)  # fmt: skip
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(2):  # the second launch finds the counters zeroed again
        skinny_sm90.skinny(tx.data_ptr(), tw.data_ptr(), ty.data_ptr(), m, n, k, dtype,
                           res=tr.data_ptr() if residual else 0, x_stride=xs, glu=glu,
                           workspace=work.data_ptr(), counters=ctr.data_ptr(), config=config,
                           w_early=True, stream=stream)  # fmt: skip
    torch.cuda.synchronize()
    # The reference from the rounded operands (what the kernel reads), in float64.
    xr = tx.double().cpu().numpy()[:, :k]
    wr = tw.double().cpu().numpy()
    ref = xr @ wr.T
    if glu:
        ref = _silu(ref[:, :n_out]) * ref[:, n_out:]
    if residual:
        ref = ref + tr.double().cpu().numpy()
    out = ty.double().cpu().numpy()
    assert not np.isnan(out).any()
    tol = 1e-2 if dtype == "bfloat16" else 2e-3
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * float(np.abs(ref).max()))
    assert not ctr.any(), "the last split leaves its tile's counter zeroed"


@pytest.mark.parametrize("m", [17, 32, 64, 100, 128])
@pytest.mark.parametrize(("k", "n"), [(2048, 2560), (2048, 2048), (5632, 2048), (136, 999)])
@pytest.mark.parametrize("residual", [False, True])
def test_skinny_matches_reference(rng: np.random.Generator, m: int, k: int, n: int,
                                  residual: bool) -> None:  # fmt: skip
    _run(rng, m, n, k, residual=residual)


@pytest.mark.parametrize("m", [17, 64, 128])
@pytest.mark.parametrize(("k", "n"), [(2048, 11264), (200, 390)])
@pytest.mark.parametrize("residual", [False, True])
def test_skinny_swiglu(rng: np.random.Generator, m: int, k: int, n: int, residual: bool) -> None:
    _run(rng, m, n, k, residual=residual, glu=True)


@pytest.mark.parametrize(
    "config",
    [(1, 6, 2, 1), (1, 8, 1, 1), (1, 4, 2, 2), (1, 4, 2, 4), (1, 6, 2, 4), (1, 4, 2, 8),
     (2, 4, 1, 2), (2, 4, 1, 4), (2, 6, 1, 1)],
)  # fmt: skip
@pytest.mark.parametrize("m", [33, 64, 128])
def test_skinny_each_geometry(rng: np.random.Generator, config: Any, m: int) -> None:
    _run(rng, m, 2048, 5632, config=config, residual=True)
    _run(rng, m, 11264, 2048, config=config)
    wg, stages = 2, config[1]  # SwiGLU takes two warpgroups
    if skinny_sm90.smem_bytes(skinny_sm90.token_cols(m), wg, stages) <= loader.max_shared_optin():
        _run(rng, m, 1030, 2048, config=config, glu=True, residual=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_skinny_strided_x_and_dtypes(rng: np.random.Generator, dtype: str) -> None:
    _run(rng, 48, 1000, 512, dtype, x_pad=24, residual=True)


def test_skinny_refuses_what_it_does_not_take() -> None:
    with pytest.raises(ShapeError, match="outside the kernel's shapes"):
        skinny_sm90.skinny(0, 0, 0, 8, 64, 64, "bfloat16")  # too few rows: the GEMV's
    with pytest.raises(ShapeError, match="workspace"):  # K split through L2
        skinny_sm90.skinny(256, 256, 256, 64, 2048, 2048, "bfloat16", config=(1, 6, 2, 1))


def _skinny_used() -> bool:
    return any(key[0] == skinny_sm90.FAMILY for key in loader._modules)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_planner_takes_it_for_decode_batches(dtype: str) -> None:
    """A 64-row decode layer compiled: RMSNorm + QKV-like linear, an O-like linear with the
    residual, RMSNorm + gate|up + SwiGLU, down + residual, against float64 NumPy."""
    rng = np.random.default_rng()
    rows, d, inter = 64, 1024, 1408

    def rnd(*shape: int, scale: float = 1.0) -> gpk.GPUArray:
        return gpk.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)

    g1, g2 = rnd(d), rnd(d)
    wqkv, wo = rnd(3 * d // 2, d, scale=d**-0.5), rnd(d, 3 * d // 2, scale=d**-0.5)
    wgu, wd = rnd(2 * inter, d, scale=d**-0.5), rnd(d, inter, scale=inter**-0.5)

    def norm(h: gpk.GPUArray, g: gpk.GPUArray) -> gpk.GPUArray:
        h32 = h.astype(gpk.float32)
        return (h32 * gpk.rsqrt((h32 * h32).mean(-1, keepdims=True) + 1e-5)).astype(h.dtype) * g

    @gpk.compile
    def layer(h: gpk.GPUArray) -> gpk.GPUArray:
        h = h + gpk.nn.linear(gpk.nn.linear(norm(h, g1), wqkv), wo)
        gu = gpk.nn.linear(norm(h, g2), wgu)
        return h + gpk.nn.linear(gpk.nn.silu(gu[..., :inter]) * gu[..., inter:], wd)

    h = rnd(rows, d)
    out = layer(h).to_numpy().astype(np.float64)

    def f64(a: gpk.GPUArray) -> np.ndarray:
        return a.to_numpy().astype(np.float64)

    def norm64(a: np.ndarray, g: gpk.GPUArray) -> np.ndarray:
        return a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-5) * f64(g)

    r = f64(h)
    r = r + (norm64(r, g1) @ f64(wqkv).T) @ f64(wo).T
    gu = norm64(r, g2) @ f64(wgu).T
    ref = r + (_silu(gu[:, :inter]) * gu[:, inter:]) @ f64(wd).T
    np.testing.assert_allclose(out, ref, rtol=3e-2, atol=3e-2 * float(np.abs(ref).max()))
    assert _skinny_used() == any(
        skinny_sm90.beats_lt(rows, n, k, e)
        for n, k, e in ((3 * d // 2, d, "none"), (d, 3 * d // 2, "residual"),
                        (2 * inter, d, "swiglu"), (d, inter, "residual"))
    )  # fmt: skip
