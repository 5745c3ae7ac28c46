"""cuBLASLt GEMMs through the GPUArray API against float64 NumPy.

Fresh random inputs per test (seed printed; PGK_TEST_SEED replays), every output allocation
poisoned (0xFF: NaN), errors measured as ||out - ref|| / ||ref|| with ref computed in
float64 from the inputs as rounded to the operand dtype.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gpk
import pygpukit.backends as backends
from pygpukit import _native
from pygpukit.backends.cuda import cublaslt, lt_choices
from pygpukit.backends.cuda.context import StepContext

pytestmark = pytest.mark.gpu

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# Relative-error bounds: fp32 accumulation, output rounded to the dtype.
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.2e-2}
SEED = int(os.environ.get("PGK_TEST_SEED", np.random.default_rng().integers(2**32)))
print(f"test_cublaslt seed {SEED}")


@pytest.fixture(autouse=True)
def cuda() -> Iterator[Any]:
    b: Any = backends.get_backend()
    if b.name != "cuda":
        pytest.skip("the CUDA backend is not active")
    reason = cublaslt.cublaslt_unavailable_reason()
    if reason:
        pytest.skip(f"cuBLASLt is not available: {reason}")
    saved = b.poison
    b.poison = True
    yield b
    b.synchronize()
    b.poison = saved
    gpk.set_tf32(False)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(request.node.name.encode())])


def backend_workspace(cuda: Any, a: np.ndarray, b: np.ndarray) -> tuple[Any, int] | None:
    """The backend's cuBLASLt workspace (buffer, bytes), made by a GEMM run through it.
    The product is realised: a lazy `a @ b` left unread runs nothing, and the workspace
    would then exist only where an earlier test in the same process made it."""
    (gpk.from_numpy(a) @ gpk.from_numpy(b)).to_numpy()
    return cublaslt._workspaces.get(cuda)


def rand(rng: np.random.Generator, shape: tuple[int, ...], d: str, scale: float = 1.0
         ) -> np.ndarray:  # fmt: skip
    return (rng.standard_normal(shape) * scale).astype(NP[d])


def f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def rel_err(out: gpk.GPUArray, ref: np.ndarray) -> float:
    o = f64(out.to_numpy())
    assert o.shape == ref.shape
    assert np.isfinite(o).all(), "unwritten (poisoned) or non-finite output elements"
    return float(np.linalg.norm(o - ref) / np.linalg.norm(ref))


def lt_plans() -> int:
    return int(_native.cublaslt_cache_stats()["misses"])


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mkn", [(192, 256, 136), (37, 53, 29), (1, 64, 200)])
def test_matmul_dtypes(rng: np.random.Generator, d: str, mkn: tuple[int, int, int]) -> None:
    m, k, n = mkn
    a, b = rand(rng, (m, k), d), rand(rng, (k, n), d)
    before = lt_plans() + int(_native.cublaslt_cache_stats()["hits"])
    out = gpk.from_numpy(a) @ gpk.from_numpy(b)
    assert rel_err(out, f64(a) @ f64(b)) < TOL[d]
    stats = _native.cublaslt_cache_stats()
    assert int(stats["misses"]) + int(stats["hits"]) > before, "cuBLASLt was not used"


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16"])
def test_batched_broadcast_transposed(rng: np.random.Generator, d: str) -> None:
    a, b = rand(rng, (4, 48, 72), d), rand(rng, (4, 72, 40), d)
    out = gpk.from_numpy(a) @ gpk.from_numpy(b)
    assert rel_err(out, f64(a) @ f64(b)) < TOL[d]
    # B broadcast over A's batch (folds into one GEMM), A broadcast over B's (stride 0).
    b2 = rand(rng, (72, 40), d)
    assert rel_err(gpk.from_numpy(a) @ gpk.from_numpy(b2), f64(a) @ f64(b2)) < TOL[d]
    a2 = rand(rng, (48, 72), d)
    assert rel_err(gpk.from_numpy(a2) @ gpk.from_numpy(b), f64(a2) @ f64(b)) < TOL[d]
    # 2-level batch with a broadcast axis, and transposed operands (views, no copies).
    a3, b3 = rand(rng, (3, 1, 16, 24), d), rand(rng, (2, 24, 8), d)
    assert rel_err(gpk.from_numpy(a3) @ gpk.from_numpy(b3), f64(a3) @ f64(b3)) < TOL[d]
    w = rand(rng, (40, 72), d)
    assert rel_err(gpk.from_numpy(a) @ gpk.from_numpy(w).T, f64(a) @ f64(w).T) < TOL[d]
    at = rand(rng, (72, 48), d)
    assert rel_err(gpk.from_numpy(at).T @ gpk.from_numpy(b2), f64(at).T @ f64(b2)) < TOL[d]


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("act", ["none", "gelu_tanh", "gelu_erf", "silu"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_epilogues(rng: np.random.Generator, d: str, act: str, with_bias: bool) -> None:
    k, n = 256, 96
    x = rand(rng, (3, 40, k), d)
    w = rand(rng, (n, k), d, 1 / math.sqrt(k))
    b = rand(rng, (n,), d, 0.5)
    pre = f64(x) @ f64(w).T + (f64(b) if with_bias else 0)
    ref = {"none": lambda v: v, "gelu_tanh": gelu_tanh, "gelu_erf": gelu_erf, "silu": silu}[act](
        pre
    )
    out = gpk.nn.linear(gpk.from_numpy(x), gpk.from_numpy(w),
                        gpk.from_numpy(b) if with_bias else None, activation=act)  # fmt: skip
    assert rel_err(out, ref) < TOL[d] * 1.5


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("act", ["none", "gelu_tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_residual_epilogue(rng: np.random.Generator, d: str, act: str,
                                  with_bias: bool) -> None:  # fmt: skip
    """A compiled linear + residual (folded into one linear step): the residual is added by
    the GEMM (C, beta = 1; here a view with padded rows) when there is no activation, else
    after it by an add kernel; both against float64."""
    k, n = 192, 80
    x = rand(rng, (2, 48, k), d)
    w = rand(rng, (n, k), d, 1 / math.sqrt(k))
    b = rand(rng, (n,), d, 0.5)
    wide = rand(rng, (2, 48, n + 16), d)
    pre = f64(x) @ f64(w).T + (f64(b) if with_bias else 0)
    ref = (gelu_tanh(pre) if act == "gelu_tanh" else pre) + f64(wide)[..., :n]

    @gpk.compile
    def f(x: gpk.GPUArray, w: gpk.GPUArray, b: gpk.GPUArray, wide: gpk.GPUArray) -> gpk.GPUArray:
        y = gpk.nn.linear(x, w, b if with_bias else None, activation=act)
        return y + wide[:, :, :n]

    for _ in range(2):  # the planned first call, then the replay
        out = f(gpk.from_numpy(x), gpk.from_numpy(w), gpk.from_numpy(b), gpk.from_numpy(wide))
        assert rel_err(out, ref) < TOL[d] * 1.5


def test_gelu_epilogue_is_tanh_form(rng: np.random.Generator) -> None:
    """float32 is precise enough to tell the tanh GELU from the erf one."""
    x, w, b = rand(rng, (64, 128), "float32"), rand(rng, (80, 128), "float32", 0.2), None
    pre = f64(x) @ f64(w).T
    out = gpk.nn.linear(gpk.from_numpy(x), gpk.from_numpy(w), b, activation="gelu_tanh")
    err_tanh, err_erf = rel_err(out, gelu_tanh(pre)), rel_err(out, gelu_erf(pre))
    assert err_tanh < 1e-5 < err_erf


def test_tf32_opt_in_changes_error(rng: np.random.Generator) -> None:
    m, k, n = 128, 1024, 96
    a, b = rand(rng, (m, k), "float32"), rand(rng, (k, n), "float32")
    ref = f64(a) @ f64(b)
    ga, gb = gpk.from_numpy(a), gpk.from_numpy(b)
    assert not gpk.tf32_enabled()
    err_f32 = rel_err(ga @ gb, ref)
    gpk.set_tf32(True)
    try:
        err_tf32 = rel_err(ga @ gb, ref)  # same schedule: the plan follows the flag
    finally:
        gpk.set_tf32(False)
    err_back = rel_err(ga @ gb, ref)
    assert err_f32 < 1e-5 and err_back < 1e-5
    # TF32 keeps 10 mantissa bits (unit roundoff 2**-11): errors near 1e-4..1e-3.
    assert 3e-5 < err_tf32 < 3e-3, (err_f32, err_tf32)


def test_plan_cache_and_single_workspace(rng: np.random.Generator, cuda: Any) -> None:
    a, b = rand(rng, (72, 88), "float16"), rand(rng, (88, 24), "float16")
    full = cublaslt.WORKSPACE_SIZES[0]
    key = dict(lda=88, ldb=24, ldd=24, align=16, workspace_bytes=full)
    p1 = _native.cublaslt_plan(72, 24, 88, "float16", **key)  # type: ignore[arg-type]
    hits = int(_native.cublaslt_cache_stats()["hits"])
    p2 = _native.cublaslt_plan(72, 24, 88, "float16", **key)  # type: ignore[arg-type]
    assert p1 is p2 or p1.key == p2.key
    assert int(_native.cublaslt_cache_stats()["hits"]) == hits + 1
    assert "float16 m72 n24 k88" in p1.key
    for _ in range(3):
        out = gpk.from_numpy(a) @ gpk.from_numpy(b)
        assert rel_err(out, f64(a) @ f64(b)) < TOL["float16"]
    got = cublaslt._workspaces.get(cuda)
    assert got is not None and len(cublaslt._workspaces) == 1
    ws, ws_bytes = got
    assert ws is not None and ws_bytes == full and ws.storage.nbytes >= full
    # A direct run with a misaligned pointer is refused, not launched (float16: the CUDA
    # array interface has no bfloat16 typestr).
    da, db, dd = (gpk.from_numpy(x) for x in (a, b, np.full((72, 24), np.nan, NP["float16"])))
    pa, pb, pd = (v.__cuda_array_interface__["data"][0] for v in (da, db, dd))
    with pytest.raises(ValueError, match="aligned"):
        p1.run(pa + 2, pb, pd, 0, ws.ptr, full, None)
    p1.run(pa, pb, pd, 0, ws.ptr, full, None)
    cuda.synchronize()
    assert rel_err(dd, f64(a) @ f64(b)) < TOL["float16"]


def test_tune_keeps_the_fastest_candidate(rng: np.random.Generator, cuda: Any) -> None:
    """tune() times the heuristic's candidates on the operands and keeps one (a later run
    uses it and is still right; a second tune returns the same choice at once); on a
    stream being captured it runs nothing and returns -1; with residual C (ldc)."""
    m, k, n = 256, 128, 96
    a, b, c = (
        rand(rng, (m, k), "float16"),
        rand(rng, (k, n), "float16"),
        rand(rng, (m, n), "float16"),
    )
    full = cublaslt.WORKSPACE_SIZES[0]
    got = backend_workspace(cuda, a, b)
    assert got is not None
    ws, ws_bytes = got
    assert ws is not None and ws_bytes == full
    p = _native.cublaslt_plan(m, n, k, "float16", lda=k, ldb=n, ldd=n, ldc=n,
                              workspace_bytes=full)  # fmt: skip
    assert p.candidates >= 1 and " C96 " in p.key
    da, db, dc = (gpk.from_numpy(x) for x in (a, b, c))
    dd = gpk.from_numpy(np.full((m, n), np.nan, NP["float16"]))
    pa, pb, pc, pd = (v.__cuda_array_interface__["data"][0] for v in (da, db, dc, dd))
    stream = _native.Stream(0, True)
    stream.begin_capture("relaxed")
    try:
        assert p.tune(pa, pb, pd, 0, pc, ws.ptr, full, stream) == -1
    finally:
        stream.end_capture()
    assert p.chosen == -1
    with pytest.raises(ValueError, match="pass c"):
        p.run(pa, pb, pd, 0, ws.ptr, full, None)
    chosen = p.tune(pa, pb, pd, 0, pc, ws.ptr, full, None)
    assert 0 <= chosen < p.candidates and p.chosen == chosen
    assert p.tune(pa, pb, pd, 0, pc, ws.ptr, full, None) == chosen
    dd2 = gpk.from_numpy(np.full((m, n), np.nan, NP["float16"]))
    p.run(pa, pb, dd2.__cuda_array_interface__["data"][0], 0, ws.ptr, full, None, pc)
    cuda.synchronize()
    ref = f64(a) @ f64(b) + f64(c)
    assert rel_err(dd2, ref) < TOL["float16"] and rel_err(dd, ref) < TOL["float16"]


def test_tune_with_l2_flush(rng: np.random.Generator, cuda: Any) -> None:
    """tune() with an L2-flush scratch (overwritten before each timed launch, A copied into
    it) keeps a candidate whose runs are right, and leaves the scratch as the last timed
    launch's flush left it: zeros after A's bytes. A linear of TUNE_MIN_ROWS rows or more
    (tuned on its first run, through the backend's flush scratch) matches float64."""
    m, k, n = 320, 256, 192
    a, b = rand(rng, (m, k), "float16"), rand(rng, (k, n), "float16")
    full = cublaslt.WORKSPACE_SIZES[0]
    got = backend_workspace(cuda, a, b)
    assert got is not None
    ws, _ = got
    assert ws is not None
    p = _native.cublaslt_plan(m, n, k, "float16", lda=k, ldb=n, ldd=n, workspace_bytes=full)
    da, db = gpk.from_numpy(a), gpk.from_numpy(b)
    dd = gpk.from_numpy(np.full((m, n), np.nan, NP["float16"]))
    flush_bytes = 1 << 20
    scratch = gpk.from_numpy(np.full(flush_bytes // 2, 7, np.int16))
    pa, pb, pd, ps = (v.__cuda_array_interface__["data"][0] for v in (da, db, dd, scratch))
    chosen = p.tune(pa, pb, pd, 0, 0, ws.ptr, full, None, 2, ps, flush_bytes)
    assert 0 <= chosen < p.candidates and p.chosen == chosen
    cuda.synchronize()
    assert rel_err(dd, f64(a) @ f64(b)) < TOL["float16"]
    left = scratch.to_numpy().view(np.uint8)
    if p.candidates > 1:
        assert np.array_equal(left[: a.nbytes], a.view(np.uint8).ravel())
        assert not left[a.nbytes :].any()
    x = rand(rng, (cublaslt.TUNE_MIN_ROWS * 2, 384), "bfloat16")
    w = rand(rng, (200, 384), "bfloat16")
    y = gpk.nn.linear(gpk.from_numpy(x), gpk.from_numpy(w))
    assert rel_err(y, f64(x) @ f64(w).T) < TOL["bfloat16"]


def test_a_later_process_takes_the_kept_choice(
    rng: np.random.Generator, cuda: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    """A plan tuned through the planner's path keeps its choice beside the kernel cache
    (lt_choices); the same problem's plan in a later process (the plan cache and the
    choices read cleared) takes it untimed (LtMatmul.choose), and runs right with it."""
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(lt_choices, "_kept", None)
    m, k, n = 384, 256, 160
    a, b = rand(rng, (m, k), "float16"), rand(rng, (k, n), "float16")
    full = cublaslt.WORKSPACE_SIZES[0]
    got = backend_workspace(cuda, a, b)
    assert got is not None and got[0] is not None and got[1] == full
    ws = got[0]
    da, db = gpk.from_numpy(a), gpk.from_numpy(b)
    pa, pb = (v.__cuda_array_interface__["data"][0] for v in (da, db))

    def plan() -> Any:
        return _native.cublaslt_plan(m, n, k, "float16", lda=k, ldb=n, ldd=n,
                                     workspace_bytes=full)  # fmt: skip

    def run(p: Any) -> int:
        # float16: the CUDA array interface has no bfloat16 typestr.
        dd = gpk.from_numpy(np.full((m, n), np.nan, NP["float16"]))
        pd = dd.__cuda_array_interface__["data"][0]
        assert cublaslt._tuned(StepContext(cuda), p, pa, pb, pd, 0, 0, ws.ptr, full)
        dd2 = gpk.from_numpy(np.full((m, n), np.nan, NP["float16"]))
        p.run(pa, pb, dd2.__cuda_array_interface__["data"][0], 0, ws.ptr, full, None)
        cuda.synchronize()
        assert rel_err(dd2, f64(a) @ f64(b)) < TOL["float16"]
        return int(p.chosen)

    p1 = plan()
    before = cublaslt.lt_timing()
    chosen = run(p1)
    assert 0 <= chosen < p1.candidates
    assert cublaslt.lt_timing_since(before)["lt_tuned"] == 1
    # The next process: a new plan of the same problem, the kept choices read anew.
    _native.cublaslt_cache_clear()
    monkeypatch.setattr(lt_choices, "_kept", None)
    p2 = plan()
    assert p2 is not p1 and p2.chosen == -1
    before = cublaslt.lt_timing()
    assert run(p2) == chosen
    since = cublaslt.lt_timing_since(before)
    assert since["lt_kept"] == 1 and since["lt_tuned"] == 0
    assert p2.candidate_id(chosen) == p1.candidate_id(chosen) != ""
    assert not p2.choose(p2.candidates) and p2.candidate_id(p2.candidates) == ""


def test_fallback_to_nvrtc_gemm(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
                                ) -> None:  # fmt: skip
    """Without cuBLASLt the mma.sync / simple kernels serve, with the same results."""
    monkeypatch.setattr(cublaslt, "_lt", {"reason": "disabled by the test"})
    before = lt_plans() + int(_native.cublaslt_cache_stats()["hits"])
    for d in ("bfloat16", "float16", "float32"):
        a, b = rand(rng, (2, 56, 120), d), rand(rng, (120, 88), d)
        assert rel_err(gpk.from_numpy(a) @ gpk.from_numpy(b), f64(a) @ f64(b)) < TOL[d] * 2
        x, w, bias = rand(rng, (24, 120), d), rand(rng, (40, 120), d, 0.1), rand(rng, (40,), d)
        out = gpk.nn.linear(gpk.from_numpy(x), gpk.from_numpy(w), gpk.from_numpy(bias),
                            activation="gelu_tanh")  # fmt: skip
        ref = gelu_tanh(f64(x) @ f64(w).T + f64(bias))
        assert rel_err(out, ref) < TOL[d] * 2
    stats = _native.cublaslt_cache_stats()
    assert int(stats["misses"]) + int(stats["hits"]) == before


def test_integer_and_float64_keep_their_kernels(rng: np.random.Generator) -> None:
    before = lt_plans() + int(_native.cublaslt_cache_stats()["hits"])
    a, b = rng.standard_normal((33, 41)), rng.standard_normal((41, 19))
    assert rel_err(gpk.from_numpy(a) @ gpk.from_numpy(b), a @ b) < 1e-12
    ai, bi = rng.integers(-5, 5, (33, 41)).astype(np.int32), rng.integers(-5, 5, (41, 19))
    out = (gpk.from_numpy(ai) @ gpk.from_numpy(bi.astype(np.int32))).to_numpy()
    np.testing.assert_array_equal(out, ai.astype(np.int64) @ bi)
    stats = _native.cublaslt_cache_stats()
    assert int(stats["misses"]) + int(stats["hits"]) == before


def test_the_backend_warms_cublaslt_on_a_thread_and_caches_no_plan() -> None:
    gpk.from_numpy(np.arange(4, dtype=np.float32)).to_numpy()  # the CUDA backend exists
    assert cublaslt._warming, "the backend starts the warm-up"
    for thread in cublaslt._warming:
        thread.join(60)
    assert _native.cublaslt_loaded()
    before = dict(_native.cublaslt_cache_stats())
    _native.cublaslt_warm("float16")  # a handle and a heuristic query; no plan kept
    assert dict(_native.cublaslt_cache_stats()) == before
