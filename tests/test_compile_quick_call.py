"""The compiled call's quick path (the guard's hit() and the CUDA backend's quick_call)
without a GPU: a program planned on the NumPy backend is run through the CUDA hooks over
a host Rust pool that evicts, and its "CUDA graph" is a stand-in that, like a real one,
reads and writes only the addresses it held when it was captured (it computes the
traced function with NumPy at those addresses). A hit that replayed a graph captured for
other addresses would leave the caller's output block stale, so every result is checked
against float64 NumPy."""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _native, _rust, errors, memory
from pygpukit.array import GPUArray
from pygpukit.backends.cuda.planned import CudaPlannedHooks
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.backends.numpy_backend import backend as numpy_backend
from pygpukit.executor import PlannedProgram
from pygpukit.ir import Node

N = 1024
MIB = 1 << 20


def _host(addr: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(addr))


class AddressGraph:
    """A captured graph: its first replay runs from the values list (as CudaReplay's
    eager first run does) and records the argument's and output's addresses; later
    replays compute out = f(arg) at those addresses only."""

    def __init__(self, prog: PlannedProgram) -> None:
        self.prog = prog
        self.reads_values = True
        self.addrs: tuple[int, int] | None = None
        self.replays = 0

    def replay(self) -> None:
        if self.addrs is None:
            prog = self.prog
            arg = prog.values[prog.schedule.input_slots[0]]
            out = prog.values[prog.schedule.output_slots[0]]
            self.addrs = (arg.ptr, out.ptr)
            self.reads_values = False
        src, dst = self.addrs
        x = _host(src, N).astype(np.float32)
        _host(dst, N)[:] = np.sin(x) * np.float32(2.0) + np.float32(0.5)
        self.replays += 1


class HostCuda(CudaPlannedHooks):
    """The CUDA backend's planned hooks over a host pool; captures are AddressGraphs."""

    poison = False

    def __init__(self, quota: int | None = None) -> None:
        self.pool = _rust.Pool(arena_bytes=MIB, quota_bytes=quota)
        memory.enable_eviction(self.pool, numpy_backend._copy_out, numpy_backend._copy_in)
        self.stream = None
        self._exec_plans: dict[Any, Any] = {}
        self.graphs: list[AddressGraph] = []

    def storage(self, value: DeviceValue) -> Any:
        return value.storage

    def capture(self, run: Any) -> AddressGraph:
        graph = AddressGraph(run.__self__)
        self.graphs.append(graph)
        return graph

    def array(self, h: np.ndarray) -> GPUArray:
        """A realised f32 array in this pool holding h."""
        storage = memory.block(self.pool, h.nbytes)
        _host(storage.addr, h.size)[:] = h
        node = Node("input", (), {"shape": h.shape, "dtype": "float32"}, h.shape, gpk.float32,
                    None, frozen=True)  # fmt: skip
        node.realized = DeviceValue(storage, h.shape, (1,), 0, gpk.float32)
        return GPUArray(node)


def _ref(h: np.ndarray) -> np.ndarray:
    return np.sin(h.astype(np.float64)) * 2.0 + 0.5


def _read(y: GPUArray) -> np.ndarray:
    v = y._node.realized
    return _host(v.ptr, math.prod(v.shape)).copy()


def _compiled(backend: HostCuda, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[int]]:
    """f traced and planned on the NumPy backend, its program re-made over `backend`;
    the second item counts the calls that took PlannedProgram.call (the full run)."""
    monkeypatch.setattr(_native, "memcpy_dtod_async",
                        lambda dst, src, n, stream: ctypes.memmove(dst, src, n))  # fmt: skip
    f = gpk.compile(lambda x: gpk.sin(x) * 2.0 + 0.5)
    f(gpk.from_numpy(np.ones(N, np.float32)))
    entry = next(iter(f._cache.values()))
    old = entry.program
    prog = PlannedProgram(old.schedule, backend, old.external, old.plan.writeback,
                          entry.traced.n_outputs)  # fmt: skip
    entry.program = prog
    f._guard(None)  # the next call builds the guard over the new program
    full = [0]
    call = prog.call

    def counted(*a: Any, **k: Any) -> Any:
        full[0] += 1
        return call(*a, **k)

    monkeypatch.setattr(prog, "call", counted)
    return f, full


def test_hits_replay_the_graph_of_their_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = HostCuda()
    f, full = _compiled(backend, monkeypatch)
    rng = np.random.default_rng(18)
    hs = [rng.standard_normal(N).astype(np.float32) for _ in range(3)]
    xs = [backend.array(h) for h in hs]
    y = None
    for k in range(60):
        # Each result held until the next call returns: outputs alternate between blocks.
        i = (k // 7) % 3
        y = f(xs[i])
        np.testing.assert_allclose(_read(y), _ref(hs[i]), rtol=1e-5, atol=1e-5)
    st = f.stats()
    assert st["misses"] == 1 and st["calls"] == 61 and st["fast_hits"] == 59, st
    # After the first few calls of each set of addresses, hits take the quick path.
    assert f._cache[next(iter(f._cache))].program.quick is not None
    assert full[0] < 25, full
    assert sum(g.replays for g in backend.graphs) == 60


def test_an_evicted_argument_is_restored_and_read_where_it_is_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = HostCuda(quota=2 * MIB)
    f, full = _compiled(backend, monkeypatch)
    h = np.random.default_rng(5).standard_normal(N).astype(np.float32)
    x = backend.array(h)
    for _ in range(4):
        y = f(x)
    assert f._cache[next(iter(f._cache))].program.quick is not None
    before = full[0]
    storage = x._node.realized.storage
    # Fill the quota: the least recently used unpinned blocks go to the host.
    fill = [memory.block(backend.pool, 256 * 1024) for _ in range(8)]
    assert storage.evicted
    y = f(x)
    np.testing.assert_allclose(_read(y), _ref(h), rtol=1e-5, atol=1e-5)
    assert full[0] == before + 1  # the quick path saw the block move and left it to call()
    del fill
    y = f(x)
    np.testing.assert_allclose(_read(y), _ref(h), rtol=1e-5, atol=1e-5)


def test_a_freed_argument_raises_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = HostCuda()
    f, _ = _compiled(backend, monkeypatch)
    x = backend.array(np.random.default_rng(6).standard_normal(N).astype(np.float32))
    for _ in range(4):
        f(x)
    replays = sum(g.replays for g in backend.graphs)
    x._node.realized.storage.release()
    with pytest.raises(errors.FreedArrayError, match="arg 0"):
        f(x)
    assert sum(g.replays for g in backend.graphs) == replays


def test_the_native_hit_builds_what_the_python_path_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = HostCuda()
    f, full = _compiled(backend, monkeypatch)
    h = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    x = backend.array(h)
    ys = [f(x) for _ in range(6)]
    assert isinstance(f._hit, _rust.CompiledHit)
    assert isinstance(f._cache[next(iter(f._cache))].program.quick, _rust.QuickCall)
    before = full[0]
    y = f(x)
    assert full[0] == before  # served by the native hit and its quick call
    np.testing.assert_allclose(_read(y), _ref(h), rtol=1e-5, atol=1e-5)
    # The result as _Outputs.build, memory.adopt and DeviceValue() make it.
    node, ref = y._node, ys[0]._node
    assert type(y) is GPUArray and y._link is None and y._readonly is False
    assert type(node) is Node and node.id > max(z._node.id for z in ys)
    for slot in ("op", "inputs", "attrs", "shape", "dtype", "where", "origin", "_canon", "sub"):
        assert getattr(node, slot) == getattr(ref, slot), slot
    v = node.realized
    assert type(v) is DeviceValue
    assert (v.shape, v.strides, v.offset, v.dtype) == ((N,), (1,), 0, gpk.float32)
    st = v.storage
    assert type(st) is memory.Storage and st.pool is backend.pool and st.nbytes == 4 * N
    assert (st.freed, st._pins, st.gen, st.readonly) == (False, 0, 0, False)
    assert isinstance(st._h, int) and st.addr == st._addr
    # Its block goes back to the pool with the array.
    live = backend.pool.stats()["live_blocks"]
    del y, node, v, st
    assert backend.pool.stats()["live_blocks"] == live - 1


def test_another_thread_tracing_takes_the_full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.compile import trace

    backend = HostCuda()
    f, full = _compiled(backend, monkeypatch)
    h = np.random.default_rng(8).standard_normal(N).astype(np.float32)
    x = backend.array(h)
    for _ in range(4):
        f(x)
    native = f._hit.hits
    trace.TRACING.append(-1)  # a thread that is not this one is tracing
    try:
        y = f(x)
    finally:
        trace.TRACING.remove(-1)
    np.testing.assert_allclose(_read(y), _ref(h), rtol=1e-5, atol=1e-5)
    assert f._hit.hits == native  # match() served it
    f(x)
    assert f._hit.hits == native + 1


def test_a_compiled_method_held_by_its_instance_is_collected() -> None:
    import gc
    import weakref

    class Scale:
        def __init__(self) -> None:
            self.k = 3.0
            self.f = gpk.compile(self.forward)

        def forward(self, x: GPUArray) -> GPUArray:
            return x * self.k

    m = Scale()
    h = np.random.default_rng(9).standard_normal(64).astype(np.float32)
    x = gpk.from_numpy(h)
    for _ in range(3):
        y = m.f(x)
    np.testing.assert_allclose(y.to_numpy(), h.astype(np.float64) * 3.0, rtol=1e-6)
    assert isinstance(m.f._hit, _rust.CompiledHit)  # it holds m.__dict__, which holds m.f
    dead = weakref.ref(m)
    del m
    gc.collect()
    assert dead() is None
