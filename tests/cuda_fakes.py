"""Stand-ins that let the CUDA backend plan and compile every kernel without a GPU.

Kernels really go through NVRTC (toolchain.compile_kernel) for the chosen arch; only the
final launch is replaced by a check of the argument list against the kernel's format.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from typing import Any

from pygpukit import _native
from pygpukit.backends.cuda import compiler, toolchain
from pygpukit.backends.cuda.context import contiguous
from pygpukit.backends.cuda.kernels import loader
from pygpukit.backends.cuda.toolchain import compile_kernel
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.ir import DType

_addr = itertools.count(1)


class FakeStorage:
    def __init__(self, nbytes: int) -> None:
        self.addr = next(_addr) * (1 << 24)
        self.nbytes = nbytes
        self.freed = False


class FakeFunction:
    def __init__(self, name: str, cubin: bytes) -> None:
        assert cubin, name
        self.name = name
        self.launches: list[tuple[Any, ...]] = []
        # The driver's attributes of the loaded kernel: unknown here (0: launchers size
        # their grids by shared memory alone).
        self.num_regs = 0
        self.shared_bytes = 0

    def launch(self, grid: Any, block: Any, fmt: str, args: tuple[Any, ...], shared_mem: int = 0,
               stream: Any = None, pdl: bool = False) -> None:  # fmt: skip
        assert len(fmt) == len(args), (self.name, fmt, args)
        for c, a in zip(fmt, args, strict=True):
            if c in "PiIq":
                assert isinstance(a, int) and not isinstance(a, bool), (self.name, c, a)
            else:
                assert isinstance(a, int | float), (self.name, c, a)
        for g in grid if isinstance(grid, tuple) else (grid,):
            assert 1 <= g < 2**31, (self.name, grid)
        LAUNCHES.append((self.name, grid, block))

    def set_max_dynamic_shared_memory(self, n: int) -> None:
        pass


LAUNCHES: list[tuple[Any, ...]] = []


def memset(ptr: int, value: int, nbytes: int, stream: Any = None) -> None:
    """The driver's memset (a zero fill's), its arguments checked and recorded."""
    assert isinstance(ptr, int) and ptr > 0 and 0 <= value < 256 and nbytes > 0, (ptr, nbytes)
    LAUNCHES.append(("memset", ptr, nbytes))


class FakeCtx:
    def __init__(self) -> None:
        self.stream = None
        self.sm_count = 132
        self.err_addr = FakeStorage(32).addr

    def alloc(self, shape: tuple[int, ...], dtype: DType, what: str) -> DeviceValue:
        st = FakeStorage(math.prod(shape) * dtype.itemsize)
        return DeviceValue(st, shape, contiguous(shape), 0, dtype)  # type: ignore[arg-type]

    out: DeviceValue | None = None  # a planned slot, as the compiled executor hands in

    def alloc_out(self, shape: tuple[int, ...], dtype: DType, what: str) -> DeviceValue:
        o = self.out
        if o is not None and o.shape == shape and o.dtype == dtype:
            self.out = None
            return o
        return self.alloc(shape, dtype, what)

    @contextlib.contextmanager
    def scratch_only(self) -> Iterator[None]:
        saved, self.out = self.out, None
        try:
            yield
        finally:
            self.out = saved

    def tag(self, op: str, inputs: Any, loc: Any) -> int:
        return 7


def install(monkeypatch: Any, arch: str) -> None:
    def function(src: Any, arch_: str | None = None) -> FakeFunction:
        return FakeFunction(src.name, compile_kernel(src.text, arch, ("-std=c++17",)))

    def get_function(family: str, name: str, defines: Any, arch_: str | None = None) -> Any:
        return FakeFunction(name, loader.compile_family(family, defines, arch))

    # cuBLASLt needs a device: here the NVRTC GEMMs stand in (and are what gets compiled).
    from pygpukit.backends.cuda import cublaslt

    monkeypatch.setattr(cublaslt, "cublaslt_unavailable_reason", lambda: "faked")
    monkeypatch.setattr(_native, "memset", memset)
    monkeypatch.setattr(compiler, "function", function)
    monkeypatch.setattr(loader, "get_function", get_function)
    info = {"sm_count": 132, "compute_capability": (int(arch[3]), int(arch[4:])),
            "max_shared_per_block_optin": 227 * 1024, "max_shared_per_sm": 228 * 1024}  # fmt: skip
    monkeypatch.setattr(toolchain, "device_info", lambda device=None: info)
