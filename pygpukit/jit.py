"""gpk.jit: compile a CUDA C kernel from source and launch it on GPUArrays.

    k = gpk.jit(SRC, "axpy")
    k((blocks,), (256,), y, x, 2.0, n)

The parameter list is parsed from the source, so each argument converts to its declared
C type: GPUArrays and objects with __cuda_array_interface__ pass their device pointer,
Python numbers pass as the scalar type. The kernel must be `extern "C"` (the parser is
backends/cuda/signature.py, shared with the kernel templates' launchers).
"""

from __future__ import annotations

from typing import Any

from pygpukit.backends.cuda.signature import parse_params
from pygpukit.errors import CompileError, DTypeError


def compile_jit_source(source: str, name: str, options: tuple[str, ...], arch: str) -> bytes:
    """CUBIN of a jit kernel's source for `arch`, cached under a key that also covers the
    contents of the headers it includes from its include directories."""
    from pygpukit.backends.cuda.header_deps import header_dependencies
    from pygpukit.backends.cuda.toolchain import compile_kernel

    file_name = name + ".cu"
    deps = header_dependencies(source, options, file_name)
    return compile_kernel(source, arch, options, file_name, dependencies=deps)


class Kernel:
    def __init__(self, source: str, name: str, options: tuple[str, ...] = ()) -> None:
        self.name = name
        self.params = parse_params(source, name)
        self.fmt = "".join(p[2] for p in self.params)
        from pygpukit import _native
        from pygpukit.backends import get_backend
        from pygpukit.backends.cuda.toolchain import device_arch

        if get_backend().name != "cuda":
            raise CompileError(f"jit: kernel {name} needs the CUDA backend (running on "
                               f"{get_backend().name})")  # fmt: skip
        self._module = _native.Module(compile_jit_source(source, name, options, device_arch()))
        self._fn = self._module.get_function(name)

    def _arg(self, k: int, value: Any, keep: list[Any]) -> Any:
        ctype, pname, code = self.params[k]
        from pygpukit.array import GPUArray

        where = f"jit kernel {self.name}: parameter {k} {pname!r} ({ctype})"
        if code == "P":
            if isinstance(value, GPUArray):
                value.realize()
                v = value.node.realized
                keep.append(v)
                return int(v.ptr)
            cai = getattr(value, "__cuda_array_interface__", None)
            if cai is not None:
                keep.append(value)
                return int(cai["data"][0])
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise DTypeError(f"{where} takes a GPUArray or a device pointer, got "
                             f"{type(value).__name__}")  # fmt: skip
        if code in "fd":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DTypeError(f"{where} takes a number, got {type(value).__name__}")
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise DTypeError(f"{where} takes an int, got {type(value).__name__}")
        return value

    def __call__(self, grid: Any, block: Any, *args: Any, shared_mem: int = 0,
                 stream: Any = None) -> None:  # fmt: skip
        if len(args) != len(self.params):
            names = ", ".join(p[1] for p in self.params)
            raise DTypeError(f"jit kernel {self.name} takes {len(self.params)} arguments "
                             f"({names}), got {len(args)}")  # fmt: skip
        keep: list[Any] = []
        packed = tuple(self._arg(k, a, keep) for k, a in enumerate(args))
        native = None
        if stream is not None:
            from pygpukit import _native

            # The backend queues on the default stream; make its work visible to `stream`.
            _native.synchronize()
            native = getattr(stream, "native", stream)
        self._fn.launch(grid, block, self.fmt, packed, shared_mem, native)

    def __repr__(self) -> str:
        return f"gpk.jit({self.name}({', '.join(p[0] + ' ' + p[1] for p in self.params)}))"


def jit(source: str, name: str, options: tuple[str, ...] = ()) -> Kernel:
    """Compile `name` from CUDA C `source` (NVRTC, cached on disk) into a launchable kernel."""
    return Kernel(source, name, tuple(options))


__all__ = ["Kernel", "compile_jit_source", "jit", "parse_params"]
