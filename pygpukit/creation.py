"""Array factories: zeros, ones, full, empty, arange, from_numpy, asarray, random."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from pygpukit import errors
from pygpukit.ir import dtypes
from pygpukit.ir.dtypes import DType

from . import runtime
from .array import GPUArray, scalar_value
from .backends import devices, get_backend

DEFAULT_FLOAT = dtypes.float32  # like torch and JAX; from_numpy keeps float64 as float64


_MAX_BYTES = 2**63  # NumPy's limit on an array's size in bytes


def _shape(shape: Any, op: str = "shape", itemsize: int = 1) -> tuple[int, ...]:
    """A shape argument as ints: non-integers raise TypeError, negative dims and sizes over
    NumPy's limit ValueError, as in NumPy, naming op and the user's line."""
    try:
        if isinstance(shape, str) or not isinstance(shape, Sequence):
            dims: tuple[int, ...] = (operator.index(shape),)  # type: ignore[arg-type]
        else:
            dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise errors.user_error(errors.DTypeError, op, f"invalid shape {shape!r}: dims must be "
                                "integers") from None  # fmt: skip
    if any(d < 0 for d in dims):
        raise errors.user_error(errors.ShapeError, op, f"negative dimensions are not allowed "
                                f"(shape {dims})")  # fmt: skip
    if math.prod(dims) * itemsize >= _MAX_BYTES:
        raise errors.user_error(errors.GPUKitValueError, op, f"array is too big: shape {dims} "
                                f"of {itemsize}-byte items is over 2**63 bytes")  # fmt: skip
    return dims


@contextmanager
def on_device(device: Any, op: str) -> Iterator[None]:
    """The block runs on `device` (an int, 'cuda:1', a gpk.Device; None: the current one):
    what it creates lives there."""
    if device is None:
        yield
        return
    from .device import resolve

    with devices.using(resolve(device, op)):
        yield


def _like_device(x: Any, device: Any) -> Any:
    """A *_like function's device: the one asked for, else x's."""
    if device is not None or not devices.ACTIVE[0] or not isinstance(x, GPUArray):
        return device
    return x.device


def _dtype(dtype: Any, default: DType, op: str = "dtype") -> DType:
    if dtype is None:
        return default
    try:
        return dtypes.as_dtype(dtype)
    except dtypes.UnsupportedDType as e:
        raise errors.user_error(errors.DTypeError, op, str(e)) from None
    except TypeError as e:  # an unhashable or odd object given as a dtype
        raise errors.user_error(errors.DTypeError, op, f"not a dtype: {dtype!r} ({e})") from None


def full(shape: int | Sequence[int], fill_value: Any, dtype: Any = None,
         device: Any = None) -> GPUArray:  # fmt: skip
    """An array of `shape` filled with `fill_value`, as NumPy's `full`.

    Args:
        shape: The shape: an int for 1-D, or a sequence of ints.
        fill_value: The value: a Python or NumPy scalar.
        dtype: The dtype; by default the value's (int64 for an int, bool for a bool, float32
            for a float).
        device: Where the array lives (an int, 'cuda:1' or a gpk.Device); default the
            current device.

    Returns:
        A new array (recorded lazily: a constant the passes can fold).

    Raises:
        ShapeError: A negative dimension.
        OverflowError: The value does not fit the dtype (NumPy 2's checks).
    """
    return _full("full", shape, fill_value, dtype, device)


def _full(op: str, shape: Any, fill_value: Any, dtype: Any, device: Any = None) -> GPUArray:
    if isinstance(fill_value, np.generic):
        fill_value = fill_value.item()
    default = dtypes.scalar_dtype(fill_value) if isinstance(fill_value, int | float | bool) \
        else DEFAULT_FLOAT  # fmt: skip
    d = _dtype(dtype, default, op)
    dims = _shape(shape, op, d.itemsize)
    if not isinstance(fill_value, int | float | bool):
        bad: type[errors.GPUKitError] = (
            errors.GPUKitValueError if isinstance(fill_value, str) else errors.DTypeError
        )
        raise errors.user_error(bad, op, f"fill value {fill_value!r} is not a number")
    try:
        value = scalar_value(fill_value, d)
    except (OverflowError, ValueError) as e:
        cls: type[errors.GPUKitError] = (
            errors.GPUKitOverflowError if isinstance(e, OverflowError) else errors.GPUKitValueError
        )
        raise errors.user_error(cls, op, str(e)) from None
    with on_device(device, op):
        return GPUArray(runtime.record("full", (), {"shape": dims, "dtype": d.name,
                                                    "value": value}))  # fmt: skip


def zeros(shape: int | Sequence[int], dtype: Any = None, device: Any = None) -> GPUArray:
    """An array of zeros, as NumPy's `zeros`.

    Args:
        shape: The shape: an int for 1-D, or a sequence of ints.
        dtype: The dtype (default float32, as in torch and JAX).
        device: Where the array lives; default the current device.

    Returns:
        A new array.

    Raises:
        ShapeError: A negative dimension.
        DTypeError: An unsupported dtype.
    """
    return _full("zeros", shape, 0, _dtype(dtype, DEFAULT_FLOAT, "zeros"), device)


def ones(shape: int | Sequence[int], dtype: Any = None, device: Any = None) -> GPUArray:
    """An array of ones, as NumPy's `ones`.

    Args:
        shape: The shape: an int for 1-D, or a sequence of ints.
        dtype: The dtype (default float32).
        device: Where the array lives; default the current device.

    Returns:
        A new array.

    Raises:
        ShapeError: A negative dimension.
        DTypeError: An unsupported dtype.
    """
    return _full("ones", shape, 1, _dtype(dtype, DEFAULT_FLOAT, "ones"), device)


def zeros_like(x: GPUArray, dtype: Any = None, device: Any = None) -> GPUArray:
    """Zeros of x's shape and (by default) dtype.

    Args:
        x: The array whose shape (and dtype) to take.
        dtype: Another dtype, or None for x's.
        device: Another device, or None for x's.

    Returns:
        A new array.
    """
    d = _dtype(dtype, x.dtype, "zeros_like")
    return _full("zeros_like", x.shape, 0, d, _like_device(x, device))


def ones_like(x: GPUArray, dtype: Any = None, device: Any = None) -> GPUArray:
    """Ones of x's shape and (by default) dtype.

    Args:
        x: The array whose shape (and dtype) to take.
        dtype: Another dtype, or None for x's.
        device: Another device, or None for x's.

    Returns:
        A new array.
    """
    d = _dtype(dtype, x.dtype, "ones_like")
    return _full("ones_like", x.shape, 1, d, _like_device(x, device))


def empty(shape: int | Sequence[int], dtype: Any = None, device: Any = None) -> GPUArray:
    """An array of uninitialised memory, straight from the pool.

    Args:
        shape: The shape: an int for 1-D, or a sequence of ints.
        dtype: The dtype (default float32).
        device: Where the array lives; default the current device.

    Returns:
        A new, realized array whose contents are whatever the block held
        (`PYGPUKIT_POISON=1` fills new CUDA memory with 0xFF bytes, to catch reads of it).

    Raises:
        ShapeError: A negative dimension.
    """
    d = _dtype(dtype, DEFAULT_FLOAT, "empty")
    s = _shape(shape, "empty", d.itemsize)
    with on_device(device, "empty"):
        backend = get_backend()
        return GPUArray(runtime.leaf(backend.empty(s, d), s, d))  # type: ignore[attr-defined]


def arange(start: float, stop: float | None = None, step: float = 1, dtype: Any = None,
           device: Any = None) -> GPUArray:  # fmt: skip
    """Evenly spaced values in [start, stop), as NumPy's `arange`.

    Args:
        start: The first value; with `stop` None, the end (and the start is 0).
        stop: The end (excluded).
        step: The spacing (not zero).
        dtype: The dtype; by default int64 when all three are ints, else float32.
        device: Where the array lives; default the current device.

    Returns:
        A new 1-D array of `ceil((stop - start) / step)` elements (none if negative).

    Raises:
        DTypeError: A bound that is not a number.
        ValueError: A bound that is not finite.
        ZeroDivisionError: `step` is zero.
    """
    if stop is None:
        start, stop = 0, start
    for v in (start, stop, step):
        if isinstance(v, np.generic):
            v = v.item()
        if not isinstance(v, int | float):
            raise errors.user_error(
                errors.DTypeError, "arange", f"start, stop and step must be numbers, got {v!r}"
            )
        if isinstance(v, float) and not math.isfinite(v):
            raise errors.user_error(
                errors.GPUKitValueError, "arange", f"start, stop and step must be finite, got {v!r}"
            )
    if step == 0:
        raise errors.user_error(errors.GPUKitZeroDivisionError, "arange", "step must not be zero")
    n = max(0, math.ceil((stop - start) / step))
    all_int = all(isinstance(v, int) for v in (start, stop, step))
    d = _dtype(dtype, dtypes.int64 if all_int else DEFAULT_FLOAT, "arange")
    dims = _shape((n,), "arange", d.itemsize)
    with on_device(device, "arange"):
        return GPUArray(runtime.record("arange", (), {"shape": dims, "dtype": d.name,
                                                      "start": start, "step": step}))  # fmt: skip


def from_numpy(array: np.ndarray, device: Any = None) -> GPUArray:
    """Copy a NumPy array to the backend.

    Args:
        array: The NumPy array (or NumPy scalar); its dtype is kept (float64 stays float64,
            unlike `asarray` of a Python float).
        device: Where the array lives; default the current device.

    Returns:
        A new, realized array.

    Raises:
        DTypeError: Not a NumPy array, or a dtype PyGPUkit does not support.
    """
    if isinstance(array, np.generic):
        array = np.asarray(array)
    if not isinstance(array, np.ndarray):
        raise errors.user_error(
            errors.DTypeError, "from_numpy", f"expected a numpy.ndarray, got {type(array).__name__}"
        )
    return _upload(array, bulk=False, device=device)


def load_numpy(array: np.ndarray, device: Any = None) -> GPUArray:
    """from_numpy for bulk loads (checkpoint weights): where the backend has copy
    priorities (CUDA) they queue behind urgent copies such as a decode step's uploads."""
    return _upload(array, bulk=True, device=device)


def load_numpy_rows(parts: Sequence[np.ndarray], device: Any = None) -> GPUArray:
    """load_numpy of the parts (one dtype, the same trailing shape) concatenated along
    axis 0, with no host concatenation: each part is copied once, into its rows of the
    new array (a fused weight from its checkpoint tensors)."""
    first = parts[0]
    d = _dtype(first.dtype, DEFAULT_FLOAT, "load_numpy_rows")
    if any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] or p.ndim == 0
           for p in parts):  # fmt: skip
        raise errors.user_error(errors.ShapeError, "load_numpy_rows", "parts must share a "
                                f"dtype and their trailing shape, got "
                                f"{[f'{p.dtype}{list(p.shape)}' for p in parts]}")  # fmt: skip
    shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
    with on_device(device, "load_numpy_rows"):
        return GPUArray(runtime.leaf(get_backend().from_numpy_rows(parts), shape, d))


def load_numpy_groups(groups: Sequence[Sequence[np.ndarray]], device: Any = None,
                      progress: Callable[[int], None] | None = None) -> list[GPUArray]:  # fmt: skip
    """load_numpy_rows of each group (one part: load_numpy), as one bulk load: where the
    backend can (CUDA), the host copies of every group run on several threads at once.
    progress(nbytes) counts the bytes copied; the arrays may be closed on return (a
    checkpoint's memory maps)."""
    host: list[list[np.ndarray]] = []
    dts = []
    for parts in groups:
        first = parts[0]
        dts.append(_dtype(first.dtype, DEFAULT_FLOAT, "load_numpy_groups"))
        if len(parts) > 1 and any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:]
                                  or p.ndim == 0 for p in parts):  # fmt: skip
            raise errors.user_error(errors.ShapeError, "load_numpy_groups", "a group's parts "
                                    f"must share a dtype and their trailing shape, got "
                                    f"{[f'{p.dtype}{list(p.shape)}' for p in parts]}")  # fmt: skip
        host.append(list(parts))
    with on_device(device, "load_numpy_groups"):
        values = get_backend().from_numpy_groups(host, progress)
    out = []
    for parts, d, value in zip(host, dts, values, strict=True):
        rows = sum(p.shape[0] for p in parts) if len(parts) > 1 else None
        shape = tuple(parts[0].shape) if rows is None else (rows, *parts[0].shape[1:])
        out.append(GPUArray(runtime.leaf(value, shape, d)))
    return out


def _upload(array: np.ndarray, bulk: bool, device: Any) -> GPUArray:
    d = _dtype(array.dtype, DEFAULT_FLOAT, "from_numpy")
    # np.ascontiguousarray would turn a 0-d array into 1-d
    host = array if array.flags.c_contiguous else array.copy(order="C")
    with on_device(device, "from_numpy"):
        b = get_backend()
        value = b.from_numpy_bulk(host) if bulk else b.from_numpy(host)
        return GPUArray(runtime.leaf(value, tuple(array.shape), d))


def asarray(x: Any, dtype: Any = None, device: Any = None) -> GPUArray:
    """`x` as a GPUArray, as NumPy's `asarray`.

    Args:
        x: A GPUArray (returned as it is), a DLPack producer (a torch or CuPy tensor:
            imported without a copy), or anything `np.asarray` takes (copied; Python floats
            become float32, NumPy arrays keep their dtype).
        dtype: Convert to this dtype.
        device: Where the array lives (a GPUArray elsewhere is copied there); default the
            current device (a GPUArray stays where it is).

    Returns:
        The array.

    Raises:
        DTypeError: `x` cannot become an array, or its dtype is not supported.
    """
    if device is None:
        return to_array(x, dtype, "asarray")
    if isinstance(x, GPUArray):
        return to_array(x.to(device), dtype, "asarray")
    with on_device(device, "asarray"):
        return to_array(x, dtype, "asarray")


def to_array(x: Any, dtype: Any, op: str) -> GPUArray:
    """asarray for an operand of op: what cannot become an array raises naming op."""
    if isinstance(x, GPUArray):
        return x if dtype is None else x.astype(dtype)
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        from .interop import from_dlpack

        arr = from_dlpack(x)
        return arr if dtype is None else arr.astype(dtype)
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged nested sequences
        raise errors.user_error(errors.GPUKitValueError, op, str(e)) from None
    if not isinstance(x, np.ndarray | np.generic) and a.dtype == np.float64:
        a = a.astype(DEFAULT_FLOAT.np)  # Python floats default to float32
    if dtype is not None:
        a = a.astype(_dtype(dtype, DEFAULT_FLOAT, op).np)
    if a.dtype.kind in "OUSVMm" and a.dtype.name != "bfloat16":
        raise errors.user_error(errors.DTypeError, op, f"cannot make an array of {a.dtype} data "
                                f"from {type(x).__name__} {x!r:.40}")  # fmt: skip
    return from_numpy(a)


array = asarray


def _number(op: str, name: str, v: Any) -> float:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise errors.user_error(errors.DTypeError, op, f"{name} must be a number, got {v!r}")
    return v


def linspace(start: float, stop: float, num: int = 50, endpoint: bool = True,
             dtype: Any = None, device: Any = None) -> GPUArray:  # fmt: skip
    """num evenly spaced values from start to stop (stop itself with endpoint=True), as
    np.linspace: computed in float64 (start + i * step, the last one exactly stop) and
    rounded once to dtype (float32 by default; integer dtypes take the floor); on
    `device` (default the current one)."""
    with on_device(device, "linspace"):
        return _linspace(start, stop, num, endpoint, dtype)


def _linspace(start: float, stop: float, num: int, endpoint: bool, dtype: Any) -> GPUArray:
    lo, hi = _number("linspace", "start", start), _number("linspace", "stop", stop)
    try:
        n = operator.index(num)
    except TypeError:
        raise errors.user_error(errors.DTypeError, "linspace", f"num must be an int, got "
                                f"{num!r}") from None  # fmt: skip
    if n < 0:
        raise errors.user_error(errors.GPUKitValueError, "linspace", f"number of samples, "
                                f"{n}, must be non-negative")  # fmt: skip
    d = _dtype(dtype, DEFAULT_FLOAT, "linspace")
    div = n - 1 if endpoint else n
    delta = float(hi) - float(lo)
    i = arange(0, n, dtype=dtypes.float64)
    if div > 0:
        step = delta / div
        y = i * step + float(lo) if step != 0 else (i / float(div)) * delta + float(lo)
    else:
        y = i * delta + float(lo)
    if endpoint and n > 1:
        y[-1] = float(hi)
    if d.is_int:
        from .ops import floor_divide

        y = floor_divide(y, 1.0)  # NumPy floors before an integer cast
    return y.astype(d)


def eye(N: int, M: int | None = None, k: int = 0, dtype: Any = None,  # noqa: N803
        device: Any = None) -> GPUArray:  # fmt: skip
    """An N x M array (M defaults to N) with ones on diagonal k (0: the main one, > 0
    above it, < 0 below) and zeros elsewhere, as np.eye; float32 by default; on `device`
    (default the current one)."""
    with on_device(device, "eye"):
        return _eye(N, M, k, dtype)


def _eye(N: int, M: int | None, k: int, dtype: Any) -> GPUArray:  # noqa: N803
    n, m = _shape((N, N if M is None else M), "eye")
    try:
        kk = operator.index(k)
    except TypeError:
        raise errors.user_error(errors.DTypeError, "eye", f"k must be an int, got "
                                f"{k!r}") from None  # fmt: skip
    d = _dtype(dtype, DEFAULT_FLOAT, "eye")
    rows = arange(n).reshape(n, 1)
    cols = arange(m).reshape(1, m)
    return (cols - rows == kk).astype(d)
