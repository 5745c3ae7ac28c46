"""The compile-ahead dry run collects every kernel of a TinyLlama-shaped decode step and
prefill chunk: their first calls, run through the CUDA backend's CudaReplay with the device
faked and NVRTC real (tests/fake_replay.py), compile nothing outside the parallel compile,
on sm_80 and sm_90. (The decode GEMVs take other geometries, so other modules, when
captured than in the eager first run: a dry run of one kind missed the other's.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

toolchain = pytest.importorskip("pygpukit.backends.cuda.toolchain")
import fake_replay  # noqa: E402

from pygpukit import _native  # noqa: E402
from pygpukit.backends.cuda.planned import DRY_RUN_OPS_SHOWN  # noqa: E402
from pygpukit.bench import llm as bench_llm  # noqa: E402
from pygpukit.llm.sampling import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def steps() -> dict[str, Any]:
    """The prefill and decode programs of a one-layer TinyLlama-shaped model (every layer
    plans alike), traced and run once on the NumPy backend."""
    cfg = dataclasses.replace(bench_llm.tinyllama_config(), num_layers=1)
    model = bench_llm.random_model(cfg, seed=23)
    model.generate_ids([list(range(3, 23))], 3, SamplingParams(), max_seq_len=64,
                       stop_at_eos=False)  # fmt: skip
    (gen,) = model._generators.values()
    return {name: next(iter(f._cache.values())).program
            for name, f in (("prefill", gen._prefill), ("decode", gen._decode))}  # fmt: skip


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_first_call_compiles_only_ahead(steps: dict[str, Any], which: str, arch: str,
                                        tmp_path: Any, monkeypatch: Any) -> None:  # fmt: skip
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))  # empty: NVRTC runs
    _native.kernel_cache_clear_memory()
    _native.kernel_cache_reset_stats()
    try:
        with fake_replay.fake_device(monkeypatch, arch) as record:
            fake_replay.first_call(steps[which], record)
    finally:
        _native.kernel_cache_clear_memory()
    replay = record.replay
    assert replay is not None and replay.fallback is None and replay.captured
    # The 20-token prefill's cuBLASLt GEMMs (gate/up, the LM head) are decode-sized: where
    # PDL is on (SM 9.0) the kernel after each starts once it has begun.
    early = which == "prefill" and arch == "sm_90"
    assert (replay.early_edges > 0) if early else replay.early_edges == 0
    assert record.compiled, "the first call compiled its kernels"
    assert record.late == [], f"compiled after the parallel compile: {record.late}"
    first = replay.first_call
    # Generated kernels compile BATCH_SIZE to an NVRTC program (each module loaded holds
    # its kernel: the fake Module checks), templates one to a program.
    assert first["kernels"] == len(set(record.asked)) >= len(record.compiled)
    assert _native.kernel_cache_stats()["compiles"] == len(record.compiled)
    # Where the dry run went: its slowest ops, each one of the program's; when each
    # kernel's compile started (from the dry run's start).
    ops = {st.op for st in steps[which].schedule.steps}
    by_op = first["dry_run_ops_ms"]
    assert by_op and set(by_op) <= ops and len(by_op) == min(len(ops), DRY_RUN_OPS_SHOWN)
    assert sum(by_op.values()) <= first["dry_run_ms"]
    assert list(by_op.values()) == sorted(by_op.values(), reverse=True)
    assert set(first["started_ms"]) == set(first["per_kernel_ms"])
    assert all(ms >= 0 for ms in first["started_ms"].values())


def test_disk_served_process_still_runs_a_new_program_dry(steps: dict[str, Any], tmp_path: Any,
                                                           monkeypatch: Any) -> None:  # fmt: skip
    """A process whose kernels so far all came from the disk cache still runs a new
    program's first call dry: its kernels may not be on disk (they compiled one after
    another in the first run). A capture of the same program for new addresses skips the
    dry run: its kernels are in memory."""
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))
    source = 'extern "C" __global__ void pgk_disk_probe(float* p) { p[0] = 2.0f; }'
    _native.kernel_cache_clear_memory()
    toolchain.compile_kernel(source, "sm_90", [], "probe.cu")  # now on disk
    _native.kernel_cache_clear_memory()
    _native.kernel_cache_reset_stats()
    toolchain.compile_kernel(source, "sm_90", [], "probe.cu")
    assert _native.kernel_cache_stats()["disk_hits"] == 1
    assert _native.kernel_cache_stats()["compiles"] == 0
    try:
        with fake_replay.fake_device(monkeypatch, "sm_90") as record:
            fake_replay.first_call(steps["decode"], record)
            replay = record.replay
            assert replay is not None and "skipped" not in replay.first_call
            assert record.compiled and record.late == [], record.late
            compiled = len(record.compiled)
            again = replay._backend.capture(replay._run)
            again.replay()
            assert again.first_call.get("skipped") == 1 and again.captured
            assert len(record.compiled) == compiled, "a new capture compiled nothing"
    finally:
        _native.kernel_cache_clear_memory()


def test_a_later_process_skips_a_known_programs_dry_run(steps: dict[str, Any], tmp_path: Any,
                                                        monkeypatch: Any) -> None:  # fmt: skip
    """After a dry run whose compiles all succeeded, the program's fingerprint is kept
    beside the kernel cache (dry_runs): the same program's first call in a later process
    (nothing in memory, nothing collected) skips the dry run and its first run compiles
    nothing (every kernel comes from disk). Once the marks are removed, as `pygpukit
    cache clear` does, the first call runs dry again."""
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    from pygpukit.backends.cuda import compiler, dry_runs
    from pygpukit.backends.cuda.kernels import loader
    from pygpukit.backends.cuda.planned import CudaReplay

    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))
    _native.kernel_cache_clear_memory()
    try:
        with fake_replay.fake_device(monkeypatch, "sm_90") as record:
            fake_replay.first_call(steps["decode"], record)
            first = record.replay
            assert first is not None and "skipped" not in first.first_call
            fp = dry_runs.fingerprint(first._run.__self__)
            assert fp is not None and dry_runs.known(fp)

            def later_process() -> Any:
                first._backend._collected.clear()
                for held in (loader._modules, loader._functions, compiler._functions):
                    held.clear()  # fake_device's own dicts: what a new process lacks
                _native.kernel_cache_clear_memory()
                _native.kernel_cache_reset_stats()
                again = first._backend.capture(first._run)
                again.replay()
                return again

            again = later_process()
            assert again.first_call.get("skipped") == 1 and again.captured
            stats = _native.kernel_cache_stats()
            assert stats["compiles"] == 0 and stats["disk_hits"] > 0
            assert dry_runs.forget() and not dry_runs.known(fp)
            again = later_process()
            assert "skipped" not in again.first_call and again.captured
            assert dry_runs.known(fp)

            # A dry run that stops early collected only part of the kernels: no mark.
            class Stopping:
                schedule = first._run.__self__.schedule

                def run(self, launch: Any) -> None:
                    raise RuntimeError("stops inside the dry run")

            assert dry_runs.forget()
            stopped = CudaReplay(first._backend, Stopping().run)
            stopped._compile_ahead()
            assert "skipped" not in stopped.first_call
            assert dry_runs.fingerprint(Stopping()) == fp and not dry_runs.known(fp)
    finally:
        _native.kernel_cache_clear_memory()
