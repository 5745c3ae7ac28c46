"""Compiling kernels ahead, in parallel (backends/cuda/compile_ahead.py): the compile sites
ask rather than compile while collecting, the parallel compile builds exactly what was
asked for, and a failed compile names its kernel and carries its NVRTC log. NVRTC runs
here (no GPU needed); loading a module needs a GPU, so the installs are recorded."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from pygpukit.errors import CompileError

toolchain = pytest.importorskip("pygpukit.backends.cuda.toolchain")
import pygpukit as gpk  # noqa: E402
from pygpukit import _native  # noqa: E402
from pygpukit.backends.cuda import compile_ahead, compiler  # noqa: E402
from pygpukit.backends.cuda.codegen import fill, mask  # noqa: E402
from pygpukit.backends.cuda.codegen.source import KernelSource  # noqa: E402
from pygpukit.backends.cuda.kernels import loader, variants  # noqa: E402
from pygpukit.ir import dtypes  # noqa: E402

ARCH = "sm_80"


@pytest.fixture
def nvrtc(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """NVRTC loaded, and an empty kernel cache: every compile runs NVRTC."""
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))
    _native.kernel_cache_clear_memory()
    _native.kernel_cache_reset_stats()
    yield
    _native.kernel_cache_clear_memory()


def _key(defines: dict[str, object]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in defines.items()))


def _recorded(requests: list[compile_ahead.Request],
              into: dict[str, bytes]) -> list[compile_ahead.Request]:  # fmt: skip
    """The requests with installs that keep the CUBIN by name (loading needs a GPU)."""

    def keep(name: str) -> object:
        return lambda cubin: into.__setitem__(name, cubin)

    return [dataclasses.replace(r, install=keep(r.name)) for r in requests]


def test_templates_asked_not_compiled_then_compiled_in_parallel(nvrtc: None) -> None:
    picked = [v for v in variants.all_variants() if v[0] in ("rms_norm", "rope", "activation")]
    picked = picked[:3] + picked[-3:]
    modules_before = dict(loader._modules)
    with compile_ahead.collecting() as asked:
        for family, names, defines in picked:
            for name in names:  # a module's kernels share one request
                assert loader.get_function(family, name, defines, ARCH) is compile_ahead.DEFERRED
        # The same module asked again: still one request.
        family, names, defines = picked[0]
        loader.get_kernel(family, names[0], defines, ARCH).fn.launch((1,), (1,), "", ())
    assert loader._modules == modules_before, "collecting must not compile or load"
    assert not compile_ahead.is_collecting()
    # Module keys end with the device (None: the primary one); a guarded template's module
    # holds the one kernel asked for (its defines name it).
    want = {(fam, _key(loader.module_defines(fam, n, d)), ARCH, None)
            for fam, names, d in picked for n in names}  # fmt: skip
    assert {key[1] for key in asked} == want
    got: dict[str, bytes] = {}
    rep = compile_ahead.compile_all(_recorded(list(asked.values()), got), workers=4)
    assert rep.kernels == len(want) == len(got) and rep.workers == 4
    assert _native.kernel_cache_stats()["compiles"] == len(want)  # NVRTC ran for each
    by_name = {r.name: r for r in asked.values()}
    for name, cubin in got.items():
        fam, dkey, _, _ = by_name[name].key[1]
        assert cubin[:4] == b"\x7fELF"
        # The same bytes as the one-at-a-time path (now a memory-cache hit of the same key).
        assert cubin == loader.compile_family(fam, dict(dkey), ARCH)
        for fam2, names, d in picked:
            for n in names:
                if fam2 == fam and _key(loader.module_defines(fam, n, d)) == dkey:
                    assert n.encode() in cubin


def test_generated_kernels_asked_then_compiled(nvrtc: None) -> None:
    srcs = [fill.generate(fill.ArangeSpec(dtypes.float32, False)),
            fill.generate(fill.ArangeSpec(dtypes.int32, True)),
            mask.generate(mask.MaskSpec("ranks"))]  # fmt: skip
    with compile_ahead.collecting() as asked:
        for src in srcs + srcs[:1]:
            assert compiler.function(src, ARCH) is compile_ahead.DEFERRED
    assert all((s.text, ARCH, None) not in compiler._functions for s in srcs)
    assert [r.key for r in asked.values()] == [("generated", (s.text, ARCH, None)) for s in srcs]
    got: dict[str, bytes] = {}
    rep = compile_ahead.compile_all(_recorded(list(asked.values()), got))
    assert rep.kernels == 3 and len(got) == 3
    for src in srcs:
        (cubin,) = [c for n, c in got.items() if n.startswith(src.name)]
        assert src.name.encode() in cubin


def _aranges() -> list[Any]:
    """Six generated kernels of one prelude (arange fills of several dtypes)."""
    kinds = [(dt, flag) for dt in (dtypes.float32, dtypes.int32, dtypes.float64)
             for flag in (False, True)]  # fmt: skip
    return [fill.generate(fill.ArangeSpec(dt, flag)) for dt, flag in kinds]


def test_generated_kernels_compile_batched(nvrtc: None) -> None:
    """Generated kernels of one prelude asked while collecting, more than the threads,
    compile BATCH_SIZE to an NVRTC program (fewer programs, each paying NVRTC's fixed cost
    once); each request's CUBIN holds its kernel. As many threads as kernels: one each."""
    srcs = _aranges()
    assert len({compiler._split(s.text)[0] for s in srcs}) == 1
    with compile_ahead.collecting(workers=0) as asked:  # no thread: none starts when asked
        for src in srcs:
            assert compiler.function(src, ARCH) is compile_ahead.DEFERRED
    reqs = list(asked.values())
    assert all(r.started is None for r in reqs), "batched requests start in compile_all"
    got: dict[str, bytes] = {}
    rep = compile_ahead.compile_all(_recorded(reqs, got), workers=1)
    programs = -(-len(srcs) // compile_ahead.BATCH_SIZE)
    assert rep.kernels == len(srcs) == len(got)
    assert _native.kernel_cache_stats()["compiles"] == programs
    for src in srcs:
        (cubin,) = [c for n, c in got.items() if n.startswith(src.name + " ")]
        assert src.name.encode() in cubin
    # Each program's time counted once in the sum.
    assert rep.compile_sum_ms < sum(rep.per_kernel_ms.values())
    assert [len(j) for j in compile_ahead._jobs(reqs, len(reqs))] == [1] * len(reqs)


def test_generated_kernels_start_when_asked_while_a_thread_is_free(nvrtc: None) -> None:
    """A generated kernel asked for while the pool has a thread free starts compiling at
    once, alone (overlapping the rest of the dry run); those asked for while every thread
    is busy wait for compile_all, which batches them. Every CUBIN holds its kernel."""
    srcs = _aranges()
    gate = threading.Event()
    real = compiler.compile_kernel

    def held(*args: Any, **kwargs: Any) -> bytes:
        gate.wait(60)  # the threads stay busy until every kernel was asked for
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiler, "compile_kernel", held)
        with compile_ahead.collecting(workers=2) as asked:
            for src in srcs:
                assert compiler.function(src, ARCH) is compile_ahead.DEFERRED
        reqs = list(asked.values())
        assert [r.started is not None for r in reqs] == [True, True] + [False] * 4
        gate.set()
        got: dict[str, bytes] = {}
        rep = compile_ahead.compile_all(_recorded(reqs, got), workers=2)
    assert rep.kernels == len(srcs) == len(got)
    # Two alone, the four others as BATCH_SIZE-bounded programs on the threads free.
    assert _native.kernel_cache_stats()["compiles"] == 2 + (-(-4 // compile_ahead.BATCH_SIZE))
    for k, src in enumerate(srcs):
        (cubin,) = [c for n, c in got.items() if n.startswith(src.name + " ")]
        assert src.name.encode() in cubin
        if k < 2:  # compiled alone: the one-at-a-time path's module (a cache hit now)
            assert cubin == real(src.text, ARCH, compiler.generated_options(), src.name + ".cu")


def test_generated_kernels_share_the_prelude_headers_parse_with_the_same_code(
        nvrtc: None) -> None:  # fmt: skip
    """Generated kernels compile with NVRTC's in-process precompiled header of their
    prelude's includes (NVRTC 12.8+): each CUBIN is byte for byte the one compiled without
    it, for several kernels of several dtypes (half types included) in turn."""
    pch = toolchain.header_pch_options()
    assert pch == (("--pch",) if toolchain.nvrtc_version() >= (12, 8) else ())
    opts = compiler.generated_options()
    assert set(pch) <= set(opts)
    without = tuple(o for o in opts if o not in pch)
    srcs = _aranges() + [fill.generate(fill.ArangeSpec(dt, False))
                         for dt in (dtypes.float16, dtypes.bfloat16)]  # fmt: skip
    for src in srcs:
        name = src.name + ".cu"
        with_pch = toolchain.compile_quick(src.text, ARCH, opts, name)
        assert with_pch == toolchain.compile_quick(src.text, ARCH, without, name), src.name


def test_a_failed_batch_compiles_each_alone(nvrtc: None) -> None:
    """A batch holding a kernel that does not compile: the others compile alone and are
    installed, and the error names the broken kernel with its log."""
    srcs = _aranges()[:3]
    prelude = compiler._split(srcs[0].text)[0]
    body = 'extern "C" __global__ void pgk_ew_broken(float* y) { y[0] = undefined_name; }\n'
    broken = KernelSource(prelude + body, "pgk_ew_broken", "P")
    with compile_ahead.collecting() as asked:
        for src in [srcs[0], broken, *srcs[1:]]:
            compiler.function(src, ARCH)
    got: dict[str, bytes] = {}
    with pytest.raises(CompileError) as info:
        compile_ahead.compile_all(_recorded(list(asked.values()), got), workers=1)
    msg = str(info.value)
    assert "1 of 4 kernels" in msg and "pgk_ew_broken" in msg and "undefined_name" in msg
    assert {n.split()[0] for n in got} == {s.name for s in srcs}


def test_compiles_run_concurrently() -> None:
    """Two compiles that can only finish together (a barrier both must reach): they run
    on two threads at once."""
    barrier = threading.Barrier(2, timeout=60)
    got: dict[str, bytes] = {}

    def compile_one() -> bytes:
        barrier.wait()
        return threading.current_thread().name.encode()

    reqs = [compile_ahead.Request(("t", k), f"k{k}", compile_one, lambda c: None) for k in range(2)]
    rep = compile_ahead.compile_all(_recorded(reqs, got), workers=2)
    assert rep.workers == 2
    assert got["k0"] != got["k1"] and all(c.startswith(b"pygpukit-nvrtc") for c in got.values())


def test_report_times_each_kernel_slowest_first() -> None:
    """The report names each kernel's compile time, the slowest (the compile wall's
    critical path) first; their sum is compile_sum_ms; with `since`, when each started."""
    got: dict[str, bytes] = {}

    def compile_for(seconds: float) -> Any:
        def run() -> bytes:
            time.sleep(seconds)
            return b"cubin"

        return run

    delays = {"fast": 0.01, "slow": 0.12, "mid": 0.05}
    reqs = [compile_ahead.Request(("t", n), n, compile_for(d), lambda c: None)
            for n, d in delays.items()]  # fmt: skip
    since = time.perf_counter()
    time.sleep(0.02)
    rep = compile_ahead.compile_all(_recorded(reqs, got), workers=3, since=since)
    assert list(rep.per_kernel_ms) == ["slow", "mid", "fast"]
    # Each compile's start, from `since`: all three started together, after the sleep.
    assert set(rep.started_ms) == set(delays) and rep.as_dict()["started_ms"] == rep.started_ms
    assert all(20 <= ms < 20 + rep.compile_wait_ms for ms in rep.started_ms.values())
    for n, d in delays.items():
        assert rep.per_kernel_ms[n] >= d * 1e3 * 0.9
    assert abs(sum(rep.per_kernel_ms.values()) - rep.compile_sum_ms) < 0.1
    assert rep.as_dict()["per_kernel_ms"] == rep.per_kernel_ms


def test_a_failed_compile_names_its_kernel_and_log(nvrtc: None) -> None:
    good = [v for v in variants.all_variants() if v[0] == "softmax"][:2]
    with compile_ahead.collecting() as asked:
        for family, names, defines in good:
            loader.get_function(family, names[0], defines, ARCH)
    bad_src = 'extern "C" __global__ void pgk_broken(float* y) { y[0] = undefined_name; }\n'
    bad = compile_ahead.Request(("t", "bad"), "pgk_broken (a test kernel)",
                                lambda: toolchain.compile_kernel(bad_src, ARCH, [], "broken.cu"),
                                lambda c: None)  # fmt: skip
    reqs = list(asked.values())
    got: dict[str, bytes] = {}
    with pytest.raises(CompileError) as info:
        compile_ahead.compile_all(_recorded([reqs[0], bad, reqs[1]], got), workers=3)
    msg = str(info.value)
    assert "1 of 3 kernels" in msg
    assert "pgk_broken (a test kernel)" in msg
    assert "undefined_name" in msg and "error" in msg  # the NVRTC log and the source line
    assert set(got) == {r.name for r in reqs}, "the kernels that compiled are installed"


def test_not_collecting_compiles_now(nvrtc: None) -> None:
    """Outside collecting() a compile site's request is refused: it compiles itself."""
    req = compile_ahead.Request(("t", 0), "k", lambda: b"", lambda c: None)
    assert compile_ahead.ask(req) is False
    with compile_ahead.collecting() as outer:
        with compile_ahead.collecting() as inner:
            assert compile_ahead.ask(req)
        assert compile_ahead.is_collecting() and not outer and list(inner) == [("t", 0)]
    assert compile_ahead.compile_all([]).kernels == 0


def test_dry_run_unless_the_program_ran_dry_before() -> None:
    """Every program's first call runs dry, whatever the disk cache served so far; only
    a later capture of a program that ran dry (new argument addresses) skips it."""
    assert compile_ahead.worth_a_dry_run(False)
    assert not compile_ahead.worth_a_dry_run(True)
    assert not compile_ahead.worth_a_dry_run(False, known_on_disk=True)


def _gemv_request() -> compile_ahead.Request:
    """The compile_ahead request of a GEMV module (a two-tier family), asked for."""
    family, names, defines = next(v for v in variants.all_variants() if v[0] == "gemv")
    with compile_ahead.collecting(workers=0) as asked:
        assert loader.get_function(family, names[0], defines, ARCH) is compile_ahead.DEFERRED
    (req,) = asked.values()
    return req


def test_two_tiers_quick_build_first_then_optimised_in_background(nvrtc: None) -> None:
    req = _gemv_request()
    assert req.fast is not None, "gemv is a two-tier family"
    family, dkey = req.key[1][0], dict(req.key[1][1])
    source = loader.kernel_source(family, dkey)
    got: dict[str, bytes] = {}
    fast = dataclasses.replace(req.fast, install=lambda c: got.__setitem__("quick", c),
                               upgrade=lambda c: got.__setitem__("optimised", c))  # fmt: skip
    rep = compile_ahead.compile_all([dataclasses.replace(req, fast=fast,
                                                         install=lambda c: 1 / 0)])  # fmt: skip
    assert rep.provisional == [req.name] and set(got) == {"quick"}  # serves the quick build
    assert compile_ahead.wait_for_upgrades(timeout=120)
    assert set(got) == {"quick", "optimised"}
    # The quick build is NVRTC's at --Ofast-compile=mid, the optimised one the family's own
    # options' (the bytes of a compile without the cache), and only that one is cached.
    quick_opts = [*loader.template_options(), *toolchain.quick_options()]
    full_opts = list(loader.template_options(family))
    dirs = toolchain.include_dirs()
    assert got["quick"] == _native.compile_cubin(source, ARCH, quick_opts, dirs, "pgk_kernel.cu",
                                                 use_cache=False)  # fmt: skip
    assert got["optimised"] == _native.compile_cubin(source, ARCH, full_opts, dirs,
                                                     "pgk_kernel.cu", use_cache=False)  # fmt: skip
    assert got["quick"] != got["optimised"]
    assert toolchain.cached_kernel(source, ARCH, full_opts, "pgk_kernel.cu") == got["optimised"]
    assert toolchain.cached_kernel(source, ARCH, quick_opts, "pgk_kernel.cu") is None
    # A later first call finds the optimised build in the cache: no quick build, no upgrade.
    _native.kernel_cache_clear_memory()  # from the disk entry
    again: dict[str, bytes] = {}
    req2 = _gemv_request()
    assert req2.fast is not None
    fast2 = dataclasses.replace(req2.fast, install=lambda c: 1 / 0, upgrade=lambda c: 1 / 0)
    rep2 = compile_ahead.compile_all([dataclasses.replace(
        req2, fast=fast2, install=lambda c: again.__setitem__("cubin", c))])  # fmt: skip
    assert rep2.provisional == [] and rep2.upgrades == []
    assert again["cubin"] == got["optimised"]


def test_two_tiers_without_a_quick_level_compile_optimised(nvrtc: None) -> None:
    req = _gemv_request()
    assert req.fast is not None

    def no_quick() -> bytes:
        raise CompileError("unknown option --Ofast-compile=mid")

    got: dict[str, bytes] = {}
    fast = dataclasses.replace(req.fast, compile=no_quick, install=lambda c: 1 / 0)
    rep = compile_ahead.compile_all([dataclasses.replace(
        req, fast=fast, install=lambda c: got.__setitem__("cubin", c))])  # fmt: skip
    assert rep.provisional == [] and rep.upgrades == []
    family, dkey = req.key[1][0], dict(req.key[1][1])
    assert got["cubin"] == loader.compile_family(family, dkey, ARCH)


def test_after_upgrades_runs_once_every_upgrade_landed() -> None:
    gate = threading.Event()
    landed: list[str] = []

    def request(name: str) -> compile_ahead.Request:
        def compile_() -> bytes:
            gate.wait(30)
            return name.encode()

        fast = compile_ahead.FastTier(cached=lambda: None, compile=lambda: b"quick",
                                      install=lambda c: None,
                                      upgrade=lambda c: landed.append(c.decode()))  # fmt: skip
        return compile_ahead.Request(("t", name), name, compile_, lambda c: 1 / 0, fast=fast)

    rep = compile_ahead.compile_all([request("a"), request("b")], workers=2)
    assert sorted(rep.provisional) == ["a", "b"] and len(rep.upgrades) == 2
    noted: list[list[str]] = []
    compile_ahead.after_upgrades(rep, lambda: noted.append(sorted(landed)))
    assert noted == []  # the optimised compiles wait on the gate
    gate.set()
    assert compile_ahead.wait_for_upgrades(timeout=30)
    deadline = time.time() + 10
    while not noted and time.time() < deadline:  # the callback runs on the last thread
        time.sleep(0.01)
    assert noted == [["a", "b"]]
    done: list[int] = []
    compile_ahead.after_upgrades(compile_ahead.Report(), lambda: done.append(1))
    assert done == [1]  # no upgrades: at once


def test_wait_for_compiles_waits_for_the_background_builds() -> None:
    gate = threading.Event()
    landed: list[bytes] = []
    fast = compile_ahead.FastTier(cached=lambda: None, compile=lambda: b"quick",
                                  install=lambda c: None, upgrade=landed.append)  # fmt: skip

    def optimised() -> bytes:
        gate.wait(30)
        return b"optimised"

    compile_ahead.compile_all([compile_ahead.Request(("t", "w"), "w", optimised, lambda c: 1 / 0,
                                                     fast=fast)])  # fmt: skip
    assert not gpk.wait_for_compiles(timeout=0.05) and landed == []  # still compiling
    gate.set()
    assert gpk.wait_for_compiles(timeout=30) and landed == [b"optimised"]
    assert gpk.wait_for_compiles(timeout=0)  # nothing left under way
