"""Where a first prefill call's time goes, without a GPU: the CUDA replay's first_call counts
cuBLASLt's tuning (each plan tuned once, in the first run, never while captured; a later
process takes the choices kept on disk instead, unless its heuristic offers other
algorithms), and the llm_prefill bench's cold rows (a fresh process with empty kernel
caches, ours and NVRTC's) give each shape's first call with a breakdown whose parts add up
to it."""

from __future__ import annotations

import dataclasses
import json
import os
import site
from typing import Any

import pytest

toolchain = pytest.importorskip("pygpukit.backends.cuda.toolchain")
import fake_replay  # noqa: E402

from pygpukit import _native  # noqa: E402
from pygpukit.backends.cuda import lt_choices  # noqa: E402
from pygpukit.bench import compiled as bench_compiled  # noqa: E402
from pygpukit.bench import llm as bench_llm  # noqa: E402
from pygpukit.llm.sampling import SamplingParams  # noqa: E402


class TunedPlan:
    """A cuBLASLt plan stand-in that tunes as LtMatmul.tune does: nothing while the stream
    is captured (-1), else once (the last of its three candidates), the choice kept; or
    takes a choice (choose) of the candidates it offers (candidate_id)."""

    candidates = 3

    def __init__(self, key: str, ids: tuple[str, ...] = ("a0", "a1", "a2")) -> None:
        self.key = key
        self.ids = ids
        self.chosen = -1
        self.tunes = 0
        self.runs = 0

    def candidate_id(self, index: int) -> str:
        return self.ids[index] if 0 <= index < len(self.ids) else ""

    def choose(self, index: int) -> bool:
        if self.chosen >= 0 or not 0 <= index < len(self.ids):
            return False
        self.chosen = index
        return True

    def run(self, *args: Any) -> None:
        self.runs += 1

    def tune(self, a: int, b: int, d: int, bias: int, c: int, ws: int, ws_bytes: int,
             stream: Any, reps: int, flush: int = 0, flush_bytes: int = 0, a_scale: int = 0,
             b_scale: int = 0) -> int:  # fmt: skip
        if getattr(stream, "capturing", False):
            return -1
        if self.chosen < 0:
            self.tunes += 1
            self.chosen = 2
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


def _first_call(prefill: Any, monkeypatch: Any, ids: tuple[str, ...] = ("a0", "a1", "a2")
                ) -> tuple[dict[str, Any], dict[tuple[Any, ...], TunedPlan]]:  # fmt: skip
    """The first call's report and the plans it made, each plan offering `ids`."""
    plans: dict[tuple[Any, ...], TunedPlan] = {}

    def plan(m: int, n: int, k: int, dtype: str, **kw: Any) -> TunedPlan:
        # The native plan cache: one plan per problem, shared by every launcher of it.
        key = (m, n, k, dtype, *sorted(kw.items()))
        return plans.setdefault(key, TunedPlan(repr(key), ids))

    try:
        with fake_replay.fake_device(monkeypatch, "sm_90") as record:
            monkeypatch.setattr(_native, "cublaslt_plan", plan)
            fake_replay.first_call(prefill, record)
    finally:
        _native.kernel_cache_clear_memory()
    replay = record.replay
    assert replay is not None and replay.captured
    return replay.first_call, plans


def test_first_call_counts_cublaslt_tuning_and_later_processes_take_its_choices(
    prefill: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(lt_choices, "_kept", None)  # this process has read no choices yet
    first, plans = _first_call(prefill, monkeypatch)
    # Every GEMM of the 256-row chunk tunes: the qkv, out, gate/up and down projections.
    assert len(plans) == 4 and all(p.tunes == 1 and p.runs > 0 for p in plans.values())
    assert first["lt_tuned"] == 4 and first["lt_kept"] == 0
    assert first["lt_tune_ms"] >= 0 and first["lt_plan_ms"] >= 0
    # The faked plans make no native plan: the heuristic never ran.
    assert first["lt_heuristics"] == 0
    assert {"dry_run_ms", "kernels", "first_run_ms", "capture_ms"} <= set(first)
    kept = json.loads((tmp_path / "kernels" / lt_choices.FILE_NAME).read_text())
    assert sorted(v["id"] for v in kept.values()) == ["a2"] * 4
    # The next process: each plan takes the kept choice (its candidate 2), none tunes.
    monkeypatch.setattr(lt_choices, "_kept", None)
    first, plans = _first_call(prefill, monkeypatch)
    assert first["lt_kept"] == 4 and first["lt_tuned"] == 0
    assert all(p.tunes == 0 and p.chosen == 2 and p.runs > 0 for p in plans.values())
    # A cuBLASLt whose heuristic offers other algorithms there tunes anew.
    monkeypatch.setattr(lt_choices, "_kept", None)
    first, plans = _first_call(prefill, monkeypatch, ids=("b0", "b1", "b2"))
    assert first["lt_kept"] == 0 and first["lt_tuned"] == 4
    assert all(p.tunes == 1 for p in plans.values())
    # `pygpukit cache clear` removes the choices with the kernels.
    assert lt_choices.forget() and not (tmp_path / "kernels" / lt_choices.FILE_NAME).exists()


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
        # first call: on CUDA the dry run, the compile wait, module loads, the first run and
        # the capture) and the rest add up to the first call (rounded to 0.01 ms each, 1 ms
        # for seconds).
        parts = sum(v for k, v in b.items() if k.endswith("_ms") and isinstance(v, float)
                    and k in ("generator_ms", "trace_ms", "passes_ms", "plan_ms", "other_ms",
                              "dry_run_ms", "compile_wait_ms", "load_ms", "first_run_ms",
                              "capture_ms"))  # fmt: skip
        assert parts == pytest.approx(r["seconds"] * 1e3, abs=1.0)
        assert r["met"] == (r["seconds"] <= bench_llm.FIRST_PREFILL_TARGET_S)


def test_cold_cache_env_isolates_nvrtcs_cache_too(tmp_path: Any) -> None:
    # NVRTC 13.0 caches in the CUDA compute cache (~/.nv): a cold process gets new ones.
    env = bench_compiled.cold_cache_env(str(tmp_path))
    for key in ("PYGPUKIT_CACHE_DIR", "HOME", "XDG_CACHE_HOME", "CUDA_CACHE_PATH"):
        assert env[key].startswith(str(tmp_path)) and env[key] != os.environ.get(key), key
    assert os.path.isdir(env["HOME"]) and not os.listdir(env["HOME"])
    assert env["PYTHONUSERBASE"] == site.getuserbase()
