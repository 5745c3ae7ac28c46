"""The kernels a TinyLlama-shaped prefill chunk launches on the CUDA backend, planned and
captured without a GPU (tests/fake_replay.py: the CUDA planners as they are, NVRTC real,
launches recorded): the attention-out and MLP-down projections add their residual in the
cuBLASLt epilogue (C = residual, beta = 1) instead of an add kernel after a GEMM into
scratch, the attention stores its output sequence-major, so merging its heads is a view
(no transposing copy, no device-to-device copy after it), and the rope and the two cache
stores ahead of it are one kernel."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

toolchain = pytest.importorskip("pygpukit.backends.cuda.toolchain")
import cuda_fakes  # noqa: E402
import fake_replay  # noqa: E402

from pygpukit import _native  # noqa: E402
from pygpukit.bench import llm as bench_llm  # noqa: E402
from pygpukit.llm.sampling import SamplingParams  # noqa: E402

LAYERS = 2


@pytest.fixture(scope="module")
def prefill() -> Any:
    """The prefill program of a two-layer TinyLlama-shaped model (a 40-token prompt: a
    64-row chunk, past the GEMV's rows), traced and run once on the NumPy backend."""
    cfg = dataclasses.replace(bench_llm.tinyllama_config(), num_layers=LAYERS)
    model = bench_llm.random_model(cfg, seed=5)
    prompt = np.random.default_rng(0).integers(3, 1000, 40).tolist()
    model.generate_ids([prompt], 1, SamplingParams(), max_seq_len=80, stop_at_eos=False)
    (gen,) = model._generators.values()
    return next(iter(gen._prefill._cache.values())).program


def test_prefill_residual_in_gemm_and_no_reshape_copy(prefill: Any, tmp_path: Any,
                                                      monkeypatch: Any) -> None:  # fmt: skip
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))
    plans: list[dict[str, Any]] = []
    copies: list[int] = []
    cuda_fakes.LAUNCHES.clear()
    try:
        with fake_replay.fake_device(monkeypatch, "sm_90") as record:

            def plan(*args: Any, **kw: Any) -> fake_replay.LtPlan:
                plans.append({"mnk": args[:3], **kw})
                return fake_replay.LtPlan()

            monkeypatch.setattr(_native, "cublaslt_plan", plan)
            monkeypatch.setattr(_native, "memcpy_dtod_async",
                                lambda dst, src, n, stream: copies.append(n))  # fmt: skip
            fake_replay.first_call(prefill, record)
    finally:
        _native.kernel_cache_clear_memory()
    replay = record.replay
    assert replay is not None and replay.fallback is None and replay.captured
    cfg = bench_llm.tinyllama_config()
    h, rows = cfg.hidden_size, 64
    with_c = [p for p in plans if p.get("ldc", 0) > 0]
    # Per layer: attention out [rows, H] @ [H, H] and MLP down [rows, I] @ [I, H], each with
    # the residual stream [rows, H] (row stride H) as C.
    assert {p["mnk"] for p in with_c} == {
        (rows, h, cfg.num_heads * cfg.head_dim), (rows, h, cfg.intermediate_size)
    }, plans  # fmt: skip
    assert all(p["ldc"] == h and p.get("epilogue", "none") == "none" for p in with_c)
    # The qkv and gate/up projections (norm prologue, no residual) plan without C; the LM
    # head of the last position takes the GEMV.
    assert {p["mnk"] for p in plans if not p.get("ldc")} == {
        (rows, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, h),
        (rows, 2 * cfg.intermediate_size, h),
    }, plans
    names = [x[0] for x in cuda_fakes.LAUNCHES]
    # Each run of the program (the planning one, the captured one) launches every layer's
    # kernels in order: after the attention (which stores its output [B, T, H, D] itself,
    # passes/sdpa_seq_major.py: no transposing copy), the out projection with the
    # residual, the MLP's norm, gate/up GEMM, SwiGLU and the down projection with the
    # residual, then the next layer's norm (or the LM head's GEMV): no add kernel after
    # either residual GEMM.
    at = [i for i, n in enumerate(names) if n == "pgk_attention_flash"]
    assert at and len(at) % LAYERS == 0, names
    # Between the QKV projection and it: one kernel that rotates q and k and stores the
    # keys and values into the caches (passes/fuse_rope_kv_write.py), no rope kernel and
    # no store kernels of their own; the first layer also gathers the chunk's cos/sin rows
    # and computes the key length, which every layer shares.
    for k, i in enumerate(at):
        qkv = max(j for j in range(i) if names[j] == "cublaslt")
        between = names[qkv + 1 : i]
        assert between.count("pgk_rope_kv_write") == 1, between
        if k % LAYERS:
            assert between == ["pgk_rope_kv_write"], between
    assert "pgk_rope" not in names, names
    for i in at:
        after = ["ew" if n.startswith("pgk_ew") else n for n in names[i + 1 : i + 7]]
        assert after[:5] == ["cublaslt", "pgk_rms_norm", "cublaslt", "pgk_swiglu",
                             "cublaslt"], names[i:]  # fmt: skip
        assert after[5] in ("pgk_rms_norm", "pgk_gemv_mma"), names[i:]
    # No step's result is copied into its slot afterwards: the 64 x H attention output (a
    # view of the attention's slot) and the projections land in their slots.
    assert not [n for n in copies if n >= rows * h * 2], copies
