"""A compiled program's first call on the CUDA backend's real replay path without a GPU.

The program is traced and planned on the NumPy backend (the schedule is backend-free),
then run through planned.CudaReplay with the CUDA planners, the compile sites and
compile_ahead as they are: only the device is faked (streams and graph capture record
nothing, modules are the CUBINs NVRTC really built, launches check their arguments,
cuBLASLt plans stand for themselves). Each NVRTC compile is recorded with whether it ran
ahead (on compile_ahead's thread pool, started by the dry run's asking, or inside
compile_all) or later.
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import cuda_fakes

from pygpukit import _native, settings
from pygpukit.backends.cuda import compile_ahead, compiler, cublaslt, signature, toolchain
from pygpukit.backends.cuda.context import Launch, contiguous
from pygpukit.backends.cuda.kernels import loader
from pygpukit.backends.cuda.planned import CudaPlannedHooks, CudaReplay
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.executor import PlannedProgram
from pygpukit.ir import DType

_addr = itertools.count(1)


class Block:
    """A pool block stand-in: a 256-byte aligned address, pinning counted."""

    def __init__(self, nbytes: int, readonly: bool = False) -> None:
        self.addr = self._addr = next(_addr) * (1 << 28)
        self.nbytes = nbytes
        self.readonly = readonly
        self.freed = False
        self.pins = 0

    def pin(self) -> None:
        self.pins += 1

    def unpin(self) -> None:
        self.pins -= 1

    def release(self) -> None:
        self.freed = True


class Graph:
    def __init__(self, nodes: int, marks: int = 0) -> None:
        self.num_nodes = nodes
        self.marks = marks  # decode GEMMs marked while captured (graph_mark_capture_tail)

    def start_after_foreign_launch(self) -> int:
        return self.marks

    def instantiate(self) -> Graph:
        return self

    def launch(self, stream: Any) -> None:
        pass


class Stream:
    """A capture stream: begin/end capture record the launches made meanwhile (counted)."""

    def __init__(self, *args: Any) -> None:
        self.capturing = False

    def begin_capture(self, mode: str) -> None:
        self.capturing = True
        self.start = len(cuda_fakes.LAUNCHES)
        self.marks = 0

    def end_capture(self) -> Graph:
        self.capturing = False
        return Graph(len(cuda_fakes.LAUNCHES) - self.start, self.marks)


def mark_capture_tail(stream: Any = None) -> int:
    """_native.graph_mark_capture_tail: counts the marks a capturing stream takes."""
    if not getattr(stream, "capturing", False):
        return 0
    stream.marks += 1
    return 1


class Module:
    def __init__(self, cubin: bytes) -> None:
        assert bytes(cubin[:4]) == b"\x7fELF", "a module loads CUBIN"
        self.cubin = bytes(cubin)

    def get_function(self, name: str) -> cuda_fakes.FakeFunction:
        assert name.encode() in self.cubin, f"kernel {name} missing from its module"
        return cuda_fakes.FakeFunction(name, self.cubin)


class LtPlan:
    key = "fake cuBLASLt plan"
    candidates = 1
    chosen = -1  # never tuned

    def run(self, *args: Any) -> None:
        cuda_fakes.LAUNCHES.append(("cublaslt", (), ()))

    def tune(self, *args: Any) -> int:
        return -1  # as while captured: nothing timed (the fake device runs nothing)

    def candidate_id(self, index: int) -> str:
        return "fake"

    def choose(self, index: int) -> bool:
        return False  # nothing is kept for it: tune never chooses


class Backend(CudaPlannedHooks):
    """What CudaPlannedHooks and the planners read of CudaBackend."""

    pool: Any = None
    poison = False
    sm_count = 132

    def __init__(self) -> None:
        self.stream = "legacy stream"
        self._exec_plans: dict[Any, Any] = {}
        self._collected: weakref.WeakSet[Any] = weakref.WeakSet()
        self._err = Block(64)

    @property
    def err_addr(self) -> int:
        return self._err.addr

    def tag(self, op: str, inputs: Any, loc: Any) -> int:
        return 7

    def alloc(self, shape: tuple[int, ...], dtype: DType, what: str,
              launch: Launch | None = None) -> DeviceValue:  # fmt: skip
        block = Block(math.prod(shape) * dtype.itemsize)
        if launch is not None and launch.keep is not None:
            launch.keep.append(block)  # type: ignore[arg-type]
        return DeviceValue(block, shape, contiguous(shape), 0, dtype)  # type: ignore[arg-type]

    def layout_key(self, value: DeviceValue) -> Any:
        return (value.strides, value.ptr % 16)

    def storage(self, value: DeviceValue) -> Any:
        return value.storage


@dataclass
class FirstCall:
    """What one first call compiled: (kernel, compiled inside compile_all) in order, and
    the module keys compile_ahead was asked for."""

    compiled: list[tuple[str, bool]] = field(default_factory=list)
    asked: list[Any] = field(default_factory=list)
    # Each compile again, by its name (for timing NVRTC with the caches emptied).
    again: dict[str, Callable[[], bytes]] = field(default_factory=dict)
    replay: CudaReplay | None = None

    @property
    def late(self) -> list[str]:
        """Kernels NVRTC compiled after the parallel compile (the dry run missed them)."""
        return [name for name, ahead in self.compiled if not ahead]


@contextmanager
def fake_device(monkeypatch: Any, arch: str = "sm_90") -> Iterator[FirstCall]:
    """The device stand-ins above installed; yields the record of the compiles."""
    info = {"sm_count": 132, "compute_capability": (int(arch[3]), int(arch[4:])),
            "max_shared_per_block_optin": 227 * 1024}  # fmt: skip
    monkeypatch.setattr(toolchain, "device_info", lambda device=None: info)
    # loader caches its answer per process: the faked device's, not an earlier one's
    monkeypatch.setattr(loader, "pdl_enabled", lambda: settings.pdl() and int(arch[3]) >= 9)
    monkeypatch.setattr(_native, "Stream", Stream)
    monkeypatch.setattr(_native, "graph_mark_capture_tail", mark_capture_tail, raising=False)
    monkeypatch.setattr(_native, "Module", Module)
    monkeypatch.setattr(_native, "memcpy_dtod_async", lambda *a: None)
    monkeypatch.setattr(_native, "memset", cuda_fakes.memset)
    monkeypatch.setattr(_native, "cublaslt_plan", lambda *a, **k: LtPlan())
    monkeypatch.setattr(cublaslt, "cublaslt_unavailable_reason", lambda: "")
    monkeypatch.setattr(cublaslt, "_workspaces", {})
    monkeypatch.setattr(loader, "_modules", {})
    monkeypatch.setattr(loader, "_functions", {})
    monkeypatch.setattr(compiler, "_functions", {})
    # One tier: every kernel compiles optimised inside the parallel compile, as recorded
    # (the two tiers' quick builds and background upgrades: tests/test_compile_ahead.py
    # and tests/gpu/test_compile_ahead_gpu.py).
    monkeypatch.setattr(toolchain, "quick_options", lambda: None)
    record = FirstCall()
    inside = threading.Event()

    def ahead() -> bool:
        # Inside compile_all, or on its thread pool: a compile started when the dry run
        # asked for it runs there before compile_all is called.
        return inside.is_set() or threading.current_thread().name.startswith("pygpukit-nvrtc")

    real_all, real_gen, real_tpl = (compile_ahead.compile_all, compiler.compile_kernel,
                                    loader.compile_source)  # fmt: skip

    def compile_all(requests: list[compile_ahead.Request], workers: int | None = None,
                    since: float | None = None) -> Any:  # fmt: skip
        record.asked += [r.key for r in requests]
        inside.set()
        try:
            return real_all(requests, workers, since)
        finally:
            inside.clear()

    def gen(source: str, arch_: str, options: Any = (), name: str = "kernel.cu") -> bytes:
        record.compiled.append((name, ahead()))
        record.again[name] = lambda: real_gen(source, arch_, options, name)
        return real_gen(source, arch_, options, name)

    def tpl(source: str, arch_: str, options: tuple[str, ...] = ()) -> bytes:
        name = _template_name(source)
        record.compiled.append((name, ahead()))
        record.again[name] = lambda: real_tpl(source, arch_, options)
        return real_tpl(source, arch_, options)

    monkeypatch.setattr(compile_ahead, "compile_all", compile_all)
    monkeypatch.setattr(compiler, "compile_kernel", gen)
    monkeypatch.setattr(loader, "compile_source", tpl)
    yield record


def _template_name(source: str) -> str:
    """A template module's name: its first kernel and its defines."""
    defines = []
    for ln in source.splitlines():
        if not ln.startswith("#define "):
            break
        if not ln.startswith(("#define PGK_ACC ", "#define PGK_ERR_")):
            defines.append(ln[8:].replace(" ", "=", 1))
    kernels = signature.kernel_names(source)
    return f"{'/'.join(kernels)} ({', '.join(defines)})"


def first_call(program: PlannedProgram, record: FirstCall) -> FirstCall:
    """Runs the first call of `program` (planned on the NumPy backend, after one call
    there) through CudaReplay over stand-in memory: externals keep their read-only mark
    (weights), arguments are fresh blocks."""
    backend = Backend()
    sched = program.schedule
    nodes = sched.graph.nodes
    cuda = PlannedProgram(sched, backend, program.external, program.plan.writeback,
                          program._n_user)  # fmt: skip
    cuda.use_arena(Block(max(cuda.plan.arena_bytes, 1)))

    def stand_in(slot: int, readonly: bool) -> DeviceValue:
        n = nodes[slot]
        block = Block(max(1, math.prod(n.shape)) * n.dtype.itemsize, readonly)
        return DeviceValue(block, n.shape, contiguous(n.shape), 0, n.dtype)  # type: ignore[arg-type]

    externals = []
    for slot in cuda.external:
        if slot < 0:
            externals.append(None)
            continue
        held = program.backend.storage(program.values[slot])
        externals.append(stand_in(slot, bool(getattr(held, "readonly", False))))
    cuda.bind(externals)
    for slot, _ in cuda._arg_slots:
        if slot >= 0:
            cuda.values[slot] = stand_in(slot, False)
    record.replay = backend.capture(cuda._run)
    record.replay.replay()
    return record
