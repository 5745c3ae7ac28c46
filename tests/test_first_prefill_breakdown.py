"""Where a first prefill call's time goes, without a GPU: the CUDA replay's first_call counts
cuBLASLt's tuning (each plan tuned once, in the first run, never while captured), and the
llm_prefill bench's cold rows (a fresh process with empty kernel caches, ours and NVRTC's)
give each shape's first call with a breakdown whose parts add up to it."""

from __future__ import annotations

import dataclasses
import os
import site
from typing import Any

import pytest

toolchain = pytest.importorskip("pygpukit.backends.cuda.toolchain")
import fake_replay  # noqa: E402

from pygpukit import _native  # noqa: E402
from pygpukit.bench import compiled as bench_compiled  # noqa: E402
from pygpukit.bench import llm as bench_llm  # noqa: E402
from pygpukit.llm.sampling import SamplingParams  # noqa: E402


class TunedPlan:
    """A cuBLASLt plan stand-in that tunes as LtMatmul.tune does: nothing while the stream
    is captured (-1), else once (the first candidate), the choice kept."""

    def __init__(self) -> None:
        self.chosen = -1
        self.tunes = 0
        self.runs = 0

    def run(self, *args: Any) -> None:
        self.runs += 1

    def tune(self, a: int, b: int, d: int, bias: int, c: int, ws: int, ws_bytes: int,
             stream: Any, reps: int) -> int:  # fmt: skip
        if getattr(stream, "capturing", False):
            return -1
        if self.chosen < 0:
            self.tunes += 1
            self.chosen = 0
        return self.chosen


@pytest.fixture(scope="module")
def prefill() -> Any:
    """The prefill program of a one-layer TinyLlama-shaped model with a 256-row chunk (past
    cuBLASLt's tuning threshold), traced and run once on the NumPy backend."""
    cfg = dataclasses.replace(bench_llm.tinyllama_config(), num_layers=1)
    model = bench_llm.random_model(cfg, seed=11)
    prompt = list(range(3, 3 + 200))
    model.generate_ids([prompt], 1, SamplingParams(), max_seq_len=272, stop_at_eos=False)
    (gen,) = model._generators.values()
    return next(iter(gen._prefill._cache.values())).program


def test_first_call_counts_cublaslt_tuning(prefill: Any, tmp_path: Any,
                                           monkeypatch: Any) -> None:  # fmt: skip
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))
    plans: dict[tuple[Any, ...], TunedPlan] = {}

    def plan(m: int, n: int, k: int, dtype: str, **kw: Any) -> TunedPlan:
        # The native plan cache: one plan per problem, shared by every launcher of it.
        return plans.setdefault((m, n, k, dtype, *sorted(kw.items())), TunedPlan())

    try:
        with fake_replay.fake_device(monkeypatch, "sm_90") as record:
            monkeypatch.setattr(_native, "cublaslt_plan", plan)
            fake_replay.first_call(prefill, record)
    finally:
        _native.kernel_cache_clear_memory()
    replay = record.replay
    assert replay is not None and replay.captured
    first = replay.first_call
    # Every GEMM of the 256-row chunk tunes: the qkv, out, gate/up and down projections.
    assert len(plans) == 4 and all(p.tunes == 1 and p.runs > 0 for p in plans.values())
    assert first["lt_tuned"] == 4
    assert first["lt_tune_ms"] >= 0 and first["lt_plan_ms"] >= 0
    # The faked plans make no native plan: the heuristic never ran.
    assert first["lt_heuristics"] == 0
    assert {"dry_run_ms", "kernels", "first_run_ms", "capture_ms"} <= set(first)


def test_cold_prefill_rows_add_up() -> None:
    shapes = ((1, 40), (2, 16))
    rows = bench_llm.bench_prefill_cold(shapes, layers=1)
    assert [(r["batch"], r["prompt_len"]) for r in rows] == list(shapes)
    assert rows[0]["workload"] == "first prefill call, cold cache"
    assert rows[1]["workload"] == "first prefill call, next new chunk shape"
    assert "empty" in rows[0]["cache"] and rows[1]["cache"] == "the same process, after 1x40"
    for r in rows:
        b = r["breakdown_ms"]
        assert r["seconds"] > 0 and r["chunks"]
        assert b["trace_ms"] > 0 and b["passes_ms"] > 0 and b["generator_ms"] > 0
        # The parts (the generator, trace, passes, plan and what the backend reports of the
        # first call) and the rest add up to the first call (rounded to 0.01 ms each, 1 ms
        # for seconds).
        parts = sum(v for k, v in b.items() if k.endswith("_ms") and isinstance(v, float)
                    and k in ("generator_ms", "trace_ms", "passes_ms", "plan_ms",
                              "other_ms"))  # fmt: skip
        assert parts == pytest.approx(r["seconds"] * 1e3, abs=1.0)
        assert r["met"] == (r["seconds"] <= bench_llm.FIRST_PREFILL_TARGET_S)


def test_cold_cache_env_isolates_nvrtcs_cache_too(tmp_path: Any) -> None:
    # NVRTC 13.0 caches in the CUDA compute cache (~/.nv): a cold process gets new ones.
    env = bench_compiled.cold_cache_env(str(tmp_path))
    for key in ("PYGPUKIT_CACHE_DIR", "HOME", "XDG_CACHE_HOME", "CUDA_CACHE_PATH"):
        assert env[key].startswith(str(tmp_path)) and env[key] != os.environ.get(key), key
    assert os.path.isdir(env["HOME"]) and not os.listdir(env["HOME"])
    assert env["PYTHONUSERBASE"] == site.getuserbase()
