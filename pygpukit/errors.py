"""The error types of PyGPUkit.

Every error subclasses GPUKitError and the builtin a Python user would catch, so
`except ValueError` keeps working around shape mistakes. The C++ and Rust layers
raise these same classes (they import this module), so there is one hierarchy.
"""

from __future__ import annotations

from collections.abc import Sequence


class GPUKitError(Exception):
    """Base class of every PyGPUkit error."""


class ShapeError(GPUKitError, ValueError):
    """Shapes that do not fit the op (broadcasting, matmul, reshape, bad axis)."""


class DTypeError(GPUKitError, TypeError):
    """A dtype the op does not support, or an argument of the wrong type."""


class IndexError_(GPUKitError, IndexError):
    """An index out of range."""


class OutOfMemoryError(GPUKitError, MemoryError):
    """The pool could not serve an allocation, even after releasing cached blocks."""


class CompileError(GPUKitError, RuntimeError):
    """NVRTC rejected a kernel; the message holds its log and the offending lines."""


class CUDAError(GPUKitError, RuntimeError):
    """A CUDA driver call failed."""


class TraceError(GPUKitError, RuntimeError):
    """A traced function did something tracing cannot record (branching on a traced value)."""


class AdmissionRejected(GPUKitError, RuntimeError):
    """The scheduler refused a task; `.reason` says why."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class FreedArrayError(GPUKitError, RuntimeError):
    """An array was used after its memory was freed."""


class LoadError(GPUKitError, ValueError, OSError):
    """A model directory or checkpoint that cannot be loaded.

    Both a ValueError (the content is malformed: a bad field, header or tensor) and an
    OSError (a file is missing, unreadable, not a regular file, or outside the model
    directory), so code written for either builtin -- what json and open() raise -- keeps
    working. The message starts with the file and the field; both are attributes too.
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None) -> None:
        parts = [p for p in (file, field) if p]
        super().__init__(": ".join([*parts, message]))
        self.file, self.field = file, field


class SettingError(GPUKitError, ValueError):
    """A setting (environment variable or gpk.set_* call) with a value it cannot take, or
    set too late (a backend already chosen)."""


__all__ = [
    "GPUKitError",
    "ShapeError",
    "DTypeError",
    "IndexError_",
    "OutOfMemoryError",
    "CompileError",
    "CUDAError",
    "TraceError",
    "AdmissionRejected",
    "FreedArrayError",
    "LoadError",
    "SettingError",
    "GPUKitOverflowError",
    "SchedulerError",
    "GPUKitValueError",
    "GPUKitZeroDivisionError",
    "AxisError",
    "UnsupportedError",
    "UnsupportedFunctionError",
    "DeviceMismatchError",
]


# (locations of the nodes a cached schedule was built from, of the nodes that ran it last):
# a cached schedule carries its first build's source lines, so an error in a later run
# that reused it from other lines is reported at the lines of that run (runtime.realize).
_LAST_RUN: list[tuple[Sequence[object], Sequence[object]] | None] = [None]


def note_run(built: Sequence[object], now: Sequence[object]) -> None:
    """Record the source locations of the latest realize (`now`, by node) beside those the
    schedule it reused was built from (`built`): describe_inputs reports the former.
    `now` may hold captured locations (ir.source.Where), resolved only when reported."""
    _LAST_RUN[0] = (built, now)


def _rebound(loc: object) -> object:
    run = _LAST_RUN[0]
    if run is None or loc is None or run[0] is run[1]:
        return loc
    try:
        i = list(run[0]).index(loc)  # only when an error is being described
    except ValueError:
        return loc
    from pygpukit.ir.source import resolve

    return resolve(run[1][i]) or loc  # type: ignore[arg-type]


def describe_inputs(inputs: Sequence[tuple[tuple[int, ...], object]], loc: object) -> str:
    """`(inputs: f32[2,3], i64[4])` and the user's line, for error messages."""
    loc = _rebound(loc)
    types = ", ".join(f"{getattr(d, 'short', d)}{list(s)}" for s, d in inputs)
    where = f"\n  at {getattr(loc, 'full', loc)}" if loc else ""
    return f"(inputs: {types}){where}"


def op_error(
    op: str, exc: Exception, inputs: Sequence[tuple[tuple[int, ...], object]], loc: object
) -> Exception:
    """The gpk error for a failing op: names the op, its input types and the user's line."""
    from pygpukit.ir.dtypes import DTypeRuleError, UnsupportedDType
    from pygpukit.ir.indexing import IndexRuleError
    from pygpukit.ir.shapes import AxisRuleError, ShapeRuleError

    msg = f"{op}: {exc} {describe_inputs(inputs, loc)}"
    if isinstance(exc, AxisRuleError) and "out of bounds" in str(exc):
        return AxisError(msg)
    if isinstance(exc, IndexRuleError | IndexError):
        return IndexError_(msg)
    if isinstance(exc, ShapeRuleError):
        return ShapeError(msg)
    if isinstance(exc, DTypeRuleError | UnsupportedDType | TypeError):
        return DTypeError(msg)
    if isinstance(exc, OverflowError):
        return GPUKitOverflowError(msg)
    if isinstance(exc, ValueError | ArithmeticError):
        return ShapeError(msg) if "shape" in str(exc) else GPUKitValueError(msg)
    return exc


class GPUKitValueError(GPUKitError, ValueError):
    """A value an op cannot take (a negative integer power, say)."""


class GPUKitOverflowError(GPUKitError, OverflowError):
    """A value out of its dtype's range (a Python int into an int8 array, inf into ints)."""


class GPUKitZeroDivisionError(GPUKitError, ZeroDivisionError):
    """A zero step or divisor where NumPy raises ZeroDivisionError (arange's step)."""


class UnsupportedFunctionError(GPUKitError, TypeError):
    """A NumPy function (or its argument) PyGPUkit has no device implementation of, called
    on a GPUArray: raised rather than copying the array to the host behind your back."""


class AxisError(ShapeError, IndexError_):
    """An axis out of range: both a ValueError and an IndexError, as numpy's AxisError."""


def user_error(cls: type[GPUKitError], op: str, message: str) -> GPUKitError:
    """cls("op: message") with the user's line: for bad arguments found before any op is
    recorded."""
    from pygpukit.ir import user_location

    loc = user_location()
    return cls(f"{op}: {message}" + (f"\n  at {loc.full}" if loc else ""))


class SchedulerError(GPUKitError, RuntimeError):
    """The scheduler is closed, or stopped on an error its dispatcher cannot recover from
    (the tasks it still held fail with this)."""


class UnsupportedError(GPUKitError, NotImplementedError):
    """A valid request this version does not implement (an einsum diagonal, a CUDA sort
    row past the kernel's length); the message says what is missing."""


class DeviceMismatchError(GPUKitError, ValueError):
    """An op given arrays on two devices (copy one over first with `x.to(device)`)."""


class DistributedError(GPUKitError, RuntimeError):
    """A communicator that is missing, mismatched between ranks or broken (a rank failed,
    NCCL returned an error), or a launch that cannot start its ranks."""
