"""A compiled function's first call compiles its kernels ahead, in parallel
(backends/cuda/compile_ahead.py): the dry run finds every kernel the real run needs, so
nothing compiles outside the parallel compile; results match float64 NumPy; the phase
times are reported; a second function of the same graph finds everything in memory; with
only disk hits counted so far, a new program still runs dry."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _native
from pygpukit.backends.cuda import compile_ahead, compiler
from pygpukit.backends.cuda.kernels import loader

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]


def _graph(x: Any, g: Any) -> Any:
    # Generated elementwise and reduce kernels (new sources: new constants) and templates.
    h = gpk.tanh(x * 0.8125 + 0.3125) * gpk.exp(x * -0.1875)
    n = gpk.nn.rms_norm(h, g, eps=1e-5)
    return gpk.nn.softmax(n * 1.5, axis=-1), (h * h).sum(axis=0)


def _ref(x: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    h = np.tanh(x * 0.8125 + 0.3125) * np.exp(x * -0.1875)
    n = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * g.astype(np.float64)
    s = n * 1.5
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), (h * h).sum(axis=0)


def test_first_call_compiles_everything_ahead(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))  # an empty disk cache
    _native.kernel_cache_reset_stats()  # counts from here: no disk hits yet, so it runs dry
    where: list[tuple[str, bool]] = []  # (kernel, compiled inside compile_all)
    inside = threading.Event()
    sources: list[tuple[Any, ...]] = []  # generated kernels compiled
    real_all, real_gen, real_tpl = (compile_ahead.compile_all, compiler.compile_kernel,
                                    loader.compile_source)  # fmt: skip

    def compile_all(requests: list[compile_ahead.Request], workers: int | None = None,
                    since: float | None = None) -> Any:  # fmt: skip
        inside.set()
        try:
            return real_all(requests, workers, since)
        finally:
            inside.clear()

    def ahead() -> bool:
        # Inside compile_all, or on its thread pool: a compile the dry run started when it
        # asked for the kernel runs there before compile_all is called.
        return inside.is_set() or threading.current_thread().name.startswith("pygpukit-nvrtc")

    def gen(source: str, arch: str, options: Any = (), name: str = "kernel.cu") -> bytes:
        where.append((name, ahead()))
        sources.append((source, arch, options, name))
        return real_gen(source, arch, options, name)

    def tpl(source: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
        where.append((source.splitlines()[0], ahead()))
        return real_tpl(source, arch, options)

    monkeypatch.setattr(compile_ahead, "compile_all", compile_all)
    monkeypatch.setattr(compiler, "compile_kernel", gen)
    monkeypatch.setattr(loader, "compile_source", tpl)
    rng = np.random.default_rng(18)
    x_np = rng.uniform(-2, 2, (24, 136)).astype(np.float32)
    g_np = rng.uniform(0.5, 1.5, 136).astype(np.float32)
    x, g = gpk.from_numpy(x_np), gpk.from_numpy(g_np)
    f = gpk.compile(_graph)
    a, b = f(x, g)
    ra, rb = _ref(x_np, g_np)
    np.testing.assert_allclose(a.to_numpy(), ra, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(b.to_numpy(), rb, rtol=2e-5, atol=2e-5 * float(np.abs(rb).max()))
    assert where, "the graph's new generated kernels were compiled"
    assert all(ok for _, ok in where), f"compiled outside the parallel compile: {where}"
    first = f.stats()["entries"][0]["replay"]["first_call"]
    # NVRTC programs: generated kernels may share one (compile_ahead.BATCH_SIZE).
    assert 0 < len(where) <= first["kernels"]
    for key in ("dry_run_ms", "compile_wall_ms", "compile_sum_ms", "load_ms", "first_run_ms",
                "capture_ms"):  # fmt: skip
        assert first[key] >= 0.0, first
    assert set(f.stats()["entries"][0]["phases_ms"]) == {"trace", "passes", "plan"}
    # The same graph traced again (another function): the program ran dry before, so its
    # mark beside the kernel cache (dry_runs) skips the dry run; every kernel is in memory.
    where.clear()
    f2 = gpk.compile(_graph)
    a2, _ = f2(x, g)
    np.testing.assert_allclose(a2.to_numpy(), ra, rtol=2e-5, atol=2e-6)
    assert where == [] and f2.stats()["entries"][0]["replay"]["first_call"].get("skipped") == 1
    # A process whose kernels have all come from the disk cache so far still runs a new
    # program dry: its kernel is not on disk, and compiles ahead.
    _native.kernel_cache_clear_memory()
    _native.kernel_cache_reset_stats()
    real_gen(*sources[0])  # from the disk cache written above
    assert _native.kernel_cache_stats()["disk_hits"] == 1
    where.clear()
    f4 = gpk.compile(lambda x, g: gpk.exp(x * 0.40625) * g)
    np.testing.assert_allclose(
        f4(x, g).to_numpy(), np.exp(x_np.astype(np.float64) * 0.40625) * g_np, rtol=2e-5
    )
    first = f4.stats()["entries"][0]["replay"]["first_call"]
    assert "skipped" not in first and first["kernels"] >= len(where) >= 1
    assert all(ok for _, ok in where), f"compiled outside the parallel compile: {where}"
    # Later calls replay the captured graph.
    for _ in range(3):
        a, b = f(x, g)
    np.testing.assert_allclose(a.to_numpy(), ra, rtol=2e-5, atol=2e-6)
    assert f.stats()["entries"][0]["replay"]["captured"]


_SCALE = r"""
extern "C" __global__ void scale(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * FACTOR + 1.0f;
}
"""


def test_replace_with_moves_functions_and_captured_graphs() -> None:
    # Two builds of "one kernel" that differ in what they compute, so the results show
    # which one each launch ran: the quick one (x * 2 + 1) and the "optimised" (x * 3 + 1).
    from pygpukit.backends.cuda import toolchain

    arch = toolchain.device_arch()
    quick = _native.Module(toolchain.compile_kernel("#define FACTOR 2.0f\n" + _SCALE, arch))
    better = _native.Module(toolchain.compile_kernel("#define FACTOR 3.0f\n" + _SCALE, arch))
    fn, opt = quick.get_function("scale"), better.get_function("scale")
    fn.mark_provisional()
    fn.set_max_dynamic_shared_memory(50000)
    n = 3000
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    dx, dy = _native.mem_alloc(n * 4), _native.mem_alloc(n * 4)
    try:
        _native.memcpy_htod(dx, x)
        s = _native.Stream()

        def run(launch: Any) -> np.ndarray:
            _native.memset(dy, 0, n * 4)
            _native.synchronize()
            launch()
            s.synchronize()
            out = np.empty(n, np.float32)
            _native.memcpy_dtoh(out, dy)
            return out.astype(np.float64)

        def captured() -> Any:
            s.begin_capture()
            fn.launch(((n + 255) // 256,), (256,), "PPi", (dy, dx, n), 0, s,
                      pdl=loader.pdl_enabled())  # fmt: skip
            return s.end_capture()

        x64 = x.astype(np.float64)
        exe = captured().instantiate()
        late = captured()  # captured with the quick build, instantiated after the swap
        np.testing.assert_allclose(run(lambda: exe.launch(s)), x64 * 2 + 1, rtol=1e-6)
        old = fn.handle
        fn.replace_with(opt)
        assert fn.handle == opt.handle != old
        assert opt.max_dynamic_shared_memory == 50000  # the raised limit carried over
        np.testing.assert_allclose(run(lambda: exe.launch(s)), x64 * 3 + 1, rtol=1e-6)
        np.testing.assert_allclose(run(lambda: late.instantiate().launch(s)), x64 * 3 + 1,
                                   rtol=1e-6)  # fmt: skip
        eager = run(lambda: fn.launch(((n + 255) // 256,), (256,), "PPi", (dy, dx, n), 0, s))
        np.testing.assert_allclose(eager, x64 * 3 + 1, rtol=1e-6)
    finally:
        _native.synchronize()
        _native.mem_free(dx)
        _native.mem_free(dy)


def test_two_tier_first_decode_upgrades_to_the_optimised_build(tmp_path: Any) -> None:
    # A small decode model in a cold kernel cache: its GEMV and decode-attention modules
    # serve the first call from quick builds; once the optimised builds land, every
    # Function taken from a quick module launches the optimised kernel (its handle is the
    # optimised module's), and the greedy tokens are those of a process that never had a
    # quick build (the next one, from the disk cache): the same code on the same inputs.
    import subprocess
    import sys

    from pygpukit.bench.compiled import cold_cache_env

    env = cold_cache_env(str(tmp_path))
    script = r"""
import json
from pygpukit.bench import llm
from pygpukit.backends.cuda import compile_ahead
from pygpukit.backends.cuda.kernels import loader
from pygpukit.llm.sampling import SamplingParams
import dataclasses
cfg = dataclasses.replace(llm.tinyllama_config(), num_layers=2)
model = llm.random_model(cfg)
prompt = [list(range(3, 40))]
first = model.generate_ids(prompt, 4, SamplingParams(), max_seq_len=64, stop_at_eos=False)
gen = model.generator(1, 64)
entries = gen._prefill.stats().get("entries", []) + gen._decode.stats().get("entries", [])
quick = sum((e["replay"].get("first_call") or {}).get("provisional", 0) for e in entries)
assert compile_ahead.wait_for_upgrades(timeout=240)
moved = []
for key, fn in list(loader._functions.items()):
    if len(key) == 5 and key[0] in loader.QUICK_FAMILIES:
        fam, dkey, arch, name, device = key
        mdef = loader.module_defines(fam, name, dict(dkey))
        mkey = (fam, tuple(sorted((k, str(v)) for k, v in mdef.items())), arch, device)
        moved.append(fn.handle == loader._modules[mkey].get_function(name).handle)
again = model.generate_ids(prompt, 4, SamplingParams(), max_seq_len=64, stop_at_eos=False)
print("RESULT " + json.dumps({"quick": quick, "left": len(loader._provisional),
      "moved": moved, "first": first.tokens, "again": again.tokens}))
"""
    outs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert line is not None, p.stderr[-3000:]
        outs.append(__import__("json").loads(line[7:]))
    cold, warm = outs
    assert cold["quick"] >= 2 and cold["left"] == 0 and cold["moved"] and all(cold["moved"])
    assert warm["quick"] == 0  # the optimised builds came from the disk cache
    assert cold["again"] == warm["first"] == warm["again"]
