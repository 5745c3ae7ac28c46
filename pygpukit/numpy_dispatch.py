"""NumPy functions on GPUArrays stay on the device (NEP 13 and NEP 18, as CuPy does).

`np.exp(a)`, `np.add(a, b)`, `np.sum(a, axis=0)`, `np.concatenate([a, b])`, `np.where(...)`
call `gpk.<same name>`, found by lookup, so a function added to gpk is picked up without a
table here; the few NumPy names spelled differently in gpk are in _ALIASES. A NumPy
function gpk does not have, or an argument it does not take, raises UnsupportedFunctionError
naming the function: nothing is copied to the host behind the user's back. Explicit copies
stay explicit: `np.asarray(a)` and `a.to_numpy()` copy to the host (through `__array__`).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from pygpukit import errors

# NumPy's name -> gpk's, where they differ.
_ALIASES = {
    "absolute": "abs",
    "true_divide": "divide",
    "bitwise_not": "invert",
    "amax": "max",
    "amin": "min",
    "concat": "concatenate",
    "permute_dims": "transpose",
}
# ufunc.reduce -> the reduction it is.
_REDUCTIONS = {
    "add": "sum",
    "multiply": "prod",
    "maximum": "max",
    "minimum": "min",
    "logical_and": "all",
    "logical_or": "any",
}
# NumPy functions that only read an array's metadata: answered without running anything.
_METADATA = {"shape", "ndim", "size"}


def _gpk_function(name: str) -> Any:
    import pygpukit

    fn = getattr(pygpukit, _ALIASES.get(name, name), None)
    return fn if callable(fn) and not isinstance(fn, type) else None


def _unsupported(what: str, why: str) -> errors.GPUKitError:
    return errors.user_error(errors.UnsupportedFunctionError, what, f"{why}; the array stays on "
                             "the device (copy it to the host explicitly with a.to_numpy() or "
                             "np.asarray(a))")  # fmt: skip


def _call(what: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise _unsupported(what, f"PyGPUkit's {fn.__name__} does not take these arguments "
                           f"({e})") from None  # fmt: skip
    return fn(*args, **kwargs)


def _store_out(what: str, result: Any, out: Any) -> Any:
    """`out=` of a ufunc: the result written into the given GPUArray, which is returned."""
    from pygpukit.array import GPUArray

    targets = out if isinstance(out, tuple) else (out,)
    if len(targets) != 1 or not isinstance(targets[0], GPUArray):
        raise _unsupported(what, "out= must be one GPUArray")
    target = targets[0]
    if target.shape != result.shape:
        raise errors.user_error(errors.ShapeError, what, f"out has shape {target.shape}, the "
                                f"result {result.shape}")  # fmt: skip
    target[...] = result
    return target


def array_ufunc(ufunc: Any, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """GPUArray.__array_ufunc__: a ufunc call (or its .reduce) as the gpk function."""
    name = getattr(ufunc, "__name__", str(ufunc))
    what = f"np.{name}" if method == "__call__" else f"np.{name}.{method}"
    out = kwargs.pop("out", None)
    if method == "__call__":
        fn = _gpk_function(name)
    elif method == "reduce":
        fn = _gpk_function(_REDUCTIONS.get(name, ""))
        if fn is not None and "axis" not in kwargs and len(inputs) == 1:
            kwargs["axis"] = 0  # ufunc.reduce's default axis is 0, not all axes
    else:
        fn = None
    if fn is None:
        raise _unsupported(what, "PyGPUkit has no device implementation of it")
    result = _call(what, fn, inputs, kwargs)
    return result if out is None else _store_out(what, result, out)


def array_function(func: Any, types: tuple[type, ...], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """GPUArray.__array_function__: a NumPy function as the gpk function of its name."""
    from pygpukit.array import GPUArray

    if not all(issubclass(t, GPUArray | np.ndarray) for t in types):
        return NotImplemented  # another library's array is involved: let it answer
    name = func.__name__
    module = getattr(func, "__module__", "") or ""
    what = f"{module.replace('numpy', 'np', 1) or 'np'}.{name}"
    if module != "numpy":  # np.linalg.norm, np.fft.fft ...: not gpk's same-named function
        raise _unsupported(what, "PyGPUkit has no device implementation of it")
    if name in _METADATA and len(args) == 1 and not kwargs and isinstance(args[0], GPUArray):
        return getattr(args[0], name)
    fn = _gpk_function(name)
    if fn is None:
        raise _unsupported(what, "PyGPUkit has no device implementation of it")
    return _call(what, fn, args, kwargs)
