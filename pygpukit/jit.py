"""gpk.jit: compile a CUDA C kernel from source and launch it on GPUArrays.

    k = gpk.jit(SRC, "axpy")                 # or gpk.jit(SRC, func="axpy")
    k((blocks,), (256,), y, x, 2.0, n)       # grid, block, then the kernel's arguments
    k(y, x, a=2.0, n=y.size)                 # by parameter name; a 1-D launch over y

The parameter list is parsed from the source, so each argument converts to its declared
C type: GPUArrays and objects with __cuda_array_interface__ pass their device pointer,
Python numbers pass as the scalar type. A pointer parameter takes only arrays of its
element type (`float*` takes float32, `void*` any), never a raw integer address: a
kernel writing through a pointer of the wrong width would scribble past the array. The
kernel must be `extern "C"` (the parser is backends/cuda/signature.py, shared with the
kernel templates' launchers).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.backends.cuda.signature import parse_params
from pygpukit.errors import CompileError, CUDAError, DTypeError

DEFAULT_BLOCK = 256  # threads per block of a launch sized from the first array

# Element type of a pointer parameter -> the NumPy dtype name its array must have;
# None: any (void*).
_POINTEE = {
    "void": None, "float": "float32", "float2": "float32", "float4": "float32",
    "double": "float64", "double2": "float64", "half": "float16", "__half": "float16",
    "half2": "float16", "__half2": "float16", "__nv_bfloat16": "bfloat16",
    "nv_bfloat16": "bfloat16", "__nv_bfloat162": "bfloat16", "int": "int32",
    "int32_t": "int32", "signed": "int32", "signed int": "int32", "int2": "int32",
    "int4": "int32", "unsigned": "uint32", "unsigned int": "uint32", "uint32_t": "uint32",
    "long long": "int64", "long long int": "int64", "int64_t": "int64", "long": "int64",
    "unsigned long long": "uint64", "uint64_t": "uint64", "short": "int16",
    "int16_t": "int16", "unsigned short": "uint16", "uint16_t": "uint16", "char": "int8",
    "signed char": "int8", "int8_t": "int8", "unsigned char": "uint8", "uint8_t": "uint8",
    "bool": "bool",
}  # fmt: skip
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct"}


def pointee_dtype(ctype: str) -> str | None:
    """The dtype name a pointer parameter of C type `ctype` points to (None for void*);
    DTypeError for an element type it cannot check."""
    base = " ".join(w for w in ctype.replace("*", " ").split() if w not in _QUALIFIERS)
    if base not in _POINTEE:
        raise DTypeError(f"jit: cannot check what a {ctype!r} parameter points to; declare "
                         "it with a plain element type (float*, __nv_bfloat16*, int*, ...) "
                         "or void*")  # fmt: skip
    return _POINTEE[base]


def compile_jit_source(source: str, name: str, options: tuple[str, ...], arch: str) -> bytes:
    """CUBIN of a jit kernel's source for `arch`, cached under a key that also covers the
    contents of the headers it includes from its include directories."""
    from pygpukit.backends.cuda.header_deps import header_dependencies
    from pygpukit.backends.cuda.toolchain import compile_kernel

    file_name = name + ".cu"
    deps = header_dependencies(source, options, file_name)
    return compile_kernel(source, arch, options, file_name, dependencies=deps)


def _cpu_reason() -> str:
    """Why this process runs on the NumPy backend, for the jit's error."""
    from pygpukit.backends import select_backend

    try:
        _, why = select_backend()
    except Exception as e:  # a bad PYGPUKIT_BACKEND: say that
        return str(e)
    return why or "PYGPUKIT_BACKEND=cpu or gpk.set_backend('cpu') chose it"


class Kernel:
    """A jit-compiled kernel; call it with (grid, block, *args) or with its arguments
    alone (positional or by parameter name) for a 1-D launch over the first array."""

    def __init__(self, source: str, name: str, options: tuple[str, ...] = ()) -> None:
        self.name = name
        self.params = parse_params(source, name)
        self.fmt = "".join(p[2] for p in self.params)
        self._pointee = {k: pointee_dtype(p[0]) for k, p in enumerate(self.params)
                         if p[2] == "P"}  # fmt: skip
        from pygpukit.backends import get_backend

        # Without CUDA the kernel is kept uncompiled: its calls still check their
        # arguments, then say why they cannot run.
        self._fn: Any = None
        if get_backend().name == "cuda":
            from pygpukit import _native
            from pygpukit.backends.cuda.toolchain import device_arch

            self._module = _native.Module(compile_jit_source(source, name, options,
                                                             device_arch()))  # fmt: skip
            self._fn = self._module.get_function(name)

    def _check_pointer(self, k: int, where: str, dtype: np.dtype[Any], what: str) -> None:
        want = self._pointee[k]
        if want is not None and dtype.name != want:
            raise DTypeError(f"{where} points to {want}, got {what} of dtype {dtype.name}")

    def _arg(self, k: int, value: Any, keep: list[Any]) -> Any:
        ctype, pname, code = self.params[k]
        from pygpukit.array import GPUArray

        where = f"jit kernel {self.name}: parameter {k} {pname!r} ({ctype})"
        if code == "P":
            if isinstance(value, GPUArray):
                self._check_pointer(k, where, value.dtype.np, "a GPUArray")
                if self._fn is None:
                    return value
                value.realize()
                v = value.node.realized
                keep.append(v)
                return int(v.ptr)
            cai = getattr(value, "__cuda_array_interface__", None)
            if cai is not None:
                self._check_pointer(k, where, np.dtype(cai["typestr"]), type(value).__name__)
                keep.append(value)
                return int(cai["data"][0])
            raise DTypeError(f"{where} takes a GPUArray or an object with "
                             f"__cuda_array_interface__, got {type(value).__name__}"
                             + (" (a raw address is not accepted: nothing says what it "
                                "points to)" if isinstance(value, int) else ""))  # fmt: skip
        if code in "fd":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DTypeError(f"{where} takes a number, got {type(value).__name__}")
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise DTypeError(f"{where} takes an int, got {type(value).__name__}")
        return value

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The arguments in parameter order, from positional ones and names."""
        names = [p[1] for p in self.params]
        listing = f"{len(names)} arguments ({', '.join(names)})"
        if len(args) > len(names):
            raise DTypeError(f"jit kernel {self.name} takes {listing}, got {len(args)} "
                             "positional")  # fmt: skip
        bound = dict(zip(names, args, strict=False))
        for key, value in kwargs.items():
            if key not in names:
                raise DTypeError(f"jit kernel {self.name} has no parameter {key!r}; it takes "
                                 f"{listing}")  # fmt: skip
            if key in bound:
                raise DTypeError(f"jit kernel {self.name}: parameter {key!r} given twice")
            bound[key] = value
        missing = [n for n in names if n not in bound]
        if missing:
            raise DTypeError(f"jit kernel {self.name} takes {listing}, missing "
                             f"{', '.join(missing)}")  # fmt: skip
        return [bound[n] for n in names]

    def _launch_shape(self, values: list[Any], grid: Any, block: Any) -> tuple[Any, Any]:
        """A grid and block: as given, or one thread per element of the first array."""
        if block is None:
            block = (DEFAULT_BLOCK,)
        if grid is not None:
            return grid, block
        from pygpukit.array import GPUArray

        first = next((v for k, v in enumerate(values) if self.params[k][2] == "P"
                      and (isinstance(v, GPUArray) or hasattr(v, "__cuda_array_interface__"))),
                     None)  # fmt: skip
        if first is None:
            raise DTypeError(f"jit kernel {self.name}: no array argument to size the launch "
                             "from; give grid= and block=")  # fmt: skip
        if isinstance(first, GPUArray):
            n = first.size
        else:
            n = int(np.prod(first.__cuda_array_interface__["shape"], dtype=np.int64))
        threads = block[0] if isinstance(block, tuple) else int(block)
        return (max(1, -(-n // threads)),), block

    def __call__(self, *args: Any, grid: Any = None, block: Any = None, shared_mem: int = 0,
                 stream: Any = None, **kwargs: Any) -> None:  # fmt: skip
        """Launch: `k(grid, block, *args)` as before, or `k(*args, **by_name)` with grid and
        block as keywords or, without them, one thread per element of the first array."""
        if not kwargs and grid is None and block is None and len(args) == len(self.params) + 2:
            grid, block, args = args[0], args[1], args[2:]
        values = self._bind(args, kwargs)
        keep: list[Any] = []
        packed = tuple(self._arg(k, a, keep) for k, a in enumerate(values))
        grid, block = self._launch_shape(values, grid, block)
        if self._fn is None:
            raise CUDAError(f"jit kernel {self.name} needs the CUDA backend; this process "
                            f"runs on the NumPy backend ({_cpu_reason()})")  # fmt: skip
        native = None
        if stream is not None:
            from pygpukit import _native

            # The backend queues on the default stream; make its work visible to `stream`.
            _native.synchronize()
            native = getattr(stream, "native", stream)
        self._fn.launch(grid, block, self.fmt, packed, shared_mem, native)

    def __repr__(self) -> str:
        return f"gpk.jit({self.name}({', '.join(p[0] + ' ' + p[1] for p in self.params)}))"


def jit(source: str, name: str | None = None, options: tuple[str, ...] = (), *,
        func: str | None = None) -> Kernel:  # fmt: skip
    """Compile a CUDA C kernel from source into a launchable `Kernel`.

    The kernel must be `extern "C"`; its parameter list is parsed from the source, and each
    call converts and checks its arguments against it. Compiled with NVRTC for the current
    GPU and cached on disk (the key covers the source, options, architecture and the headers
    it includes). On the NumPy backend the source is only parsed: each call checks its
    arguments, then raises CUDAError.

    Args:
        source: The CUDA C source.
        name: The kernel's name.
        options: NVRTC options, such as ("-I/path", "-DTILE=64").
        func: The kernel's name, the original project's spelling (give name or func).

    Returns:
        The kernel: call it as `k(*args)` (a 1-D launch over the first array argument),
        `k(grid, block, *args)`, or with `grid=`, `block=`, `shared_mem=`, `stream=`.

    Raises:
        CompileError: No name given, two different names, or NVRTC rejected the source.
        DTypeError: A pointer parameter whose element type cannot be checked.
    """
    if name is not None and func is not None and name != func:
        raise CompileError(f"jit: give the kernel's name once (name={name!r}, func={func!r})")
    kernel = name if name is not None else func
    if not isinstance(kernel, str) or not kernel:
        raise CompileError('jit: the kernel\'s name is needed: gpk.jit(source, func="scale")')
    return Kernel(source, kernel, tuple(options))


__all__ = ["Kernel", "compile_jit_source", "jit", "parse_params", "pointee_dtype"]
