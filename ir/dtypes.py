"""Data types and type promotion: the one place that knows which dtypes exist and how they
combine (docs/dtypes.md says the same for users).

A DType compares equal to what NumPy would call the same dtype: `gpk.float32 == np.float32`,
`== np.dtype("float32")`, `== "float32"` (and our short name "f32"); bfloat16 equals
ml_dtypes.bfloat16, its host type. Its hash is its NumPy dtype's, so either can look the
other up in a dict. `np.dtype(a.dtype)` works through the `.dtype` attribute NumPy reads.

Promotion is NumPy 2's (NEP 50: Python scalars are "weak" and take the array's dtype when
they fit its kind) with one change, the one torch and JAX make: float64 only comes from
float64. The default float is float32:
  - an op that makes a float from integer or bool inputs alone (true division, mean, exp,
    sqrt, sigmoid ...) gives float32: `arange(4) / 2` and `arange(4).mean()` are float32,
    and so is `exp(int8)` (NumPy: float16);
  - where NumPy would give float64 and no input is float64 (int64 + float32, an integer
    array with a Python float), the result is float32;
  - a float64 array in the inputs gives float64 as in NumPy.
Comparisons still compare exactly (in NumPy's common dtype); their result is bool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

NumPyDType = np.dtype  # spelled apart: inside DType, `np` is the property below


@dataclass(frozen=True)
class DType:
    """One of the dtypes of ALL; equal to its NumPy dtype and to the names of it."""

    name: str
    itemsize: int
    kind: str  # 'f' float, 'i' signed int, 'u' unsigned int, 'b' bool
    short: str  # used in graph dumps and CLI arg specs: bf16[1,2048]

    @property
    def np(self) -> np.dtype:
        """The NumPy dtype of this dtype (`ml_dtypes.bfloat16` for bfloat16)."""
        return _NP[self.name]

    @property
    def dtype(self) -> NumPyDType:
        """The NumPy dtype: the attribute np.dtype(x) reads, so np.dtype(a.dtype) works."""
        return _NP[self.name]

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, DType):
            return self.name == other.name
        if isinstance(other, str):
            found = _BY_NAME.get(other)
            if found is not None:
                return found.name == self.name
        return _np_equal(self.np, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        # The NumPy dtype's hash: equal objects (a DType and its np.dtype) hash alike.
        return hash(_NP[self.name])

    @property
    def is_float(self) -> bool:
        """Whether this is a floating-point dtype."""
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        """Whether this is a signed or unsigned integer dtype (bool is not)."""
        return self.kind in "iu"

    def __repr__(self) -> str:
        return f"gpk.{self.name}"

    def __str__(self) -> str:
        return self.name


float64 = DType("float64", 8, "f", "f64")
float32 = DType("float32", 4, "f", "f32")
float16 = DType("float16", 2, "f", "f16")
bfloat16 = DType("bfloat16", 2, "f", "bf16")
int8 = DType("int8", 1, "i", "i8")
uint8 = DType("uint8", 1, "u", "u8")
int16 = DType("int16", 2, "i", "i16")  # NumPy's promotion of int8 with uint8
int32 = DType("int32", 4, "i", "i32")
int64 = DType("int64", 8, "i", "i64")
bool_ = DType("bool", 1, "b", "bool")

ALL: tuple[DType, ...] = (
    float64, float32, float16, bfloat16, int8, uint8, int16, int32, int64, bool_,
)  # fmt: skip
FLOATS: tuple[DType, ...] = (float64, float32, float16, bfloat16)
DEFAULT_FLOAT = float32  # what integer inputs to a float op give, as in torch and JAX

_NP: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
_BY_NAME: dict[str, DType] = {d.name: d for d in ALL} | {d.short: d for d in ALL}
_BY_NP: dict[np.dtype, DType] = {v: _BY_NAME[k] for k, v in _NP.items()}


def _np_equal(mine: np.dtype, other: object) -> bool:
    """Whether other is what NumPy takes for this dtype (a scalar type, a dtype, a name)."""
    if other is None:  # np.dtype(None) is float64: None is no dtype here
        return False
    try:
        return bool(mine == np.dtype(other))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return False


class UnsupportedDType(TypeError):
    pass


class DTypeRuleError(TypeError):
    """An op's dtype rule rejects its input dtypes."""


def resolve_ufunc(ufunc: Any, in_dtypes: list[DType]) -> DType:
    """The result dtype of `ufunc` over these input dtypes: NumPy's type resolution, then
    the default-float rule (module docstring)."""
    return default_float_rule(numpy_ufunc_type(ufunc, in_dtypes), in_dtypes)


def numpy_ufunc_type(ufunc: Any, in_dtypes: list[DType]) -> DType:
    """NumPy's own result dtype for `ufunc` over these input dtypes."""
    try:
        res = ufunc.resolve_dtypes(tuple(d.np for d in in_dtypes) + (None,))
    except (TypeError, np.exceptions.DTypePromotionError) as e:
        names = ", ".join(d.name for d in in_dtypes)
        raise DTypeRuleError(f"no {ufunc.__name__} loop for dtypes ({names})") from e
    return as_dtype(res[-1])


def default_float_rule(result: DType, in_dtypes: list[DType]) -> DType:
    """NumPy's result dtype adjusted so float64 only comes from float64: a float made from
    integer/bool inputs alone is float32 (the default float), and so is a float64 without a
    float64 input."""
    if not result.is_float:
        return result
    if not any(d.is_float for d in in_dtypes):
        return DEFAULT_FLOAT
    if result.name == "float64" and not any(d.name == "float64" for d in in_dtypes):
        return DEFAULT_FLOAT
    return result


def as_dtype(x: Any) -> DType:
    """DType from a DType, a name ('bf16', 'float32'), a NumPy dtype or a scalar type."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    if x is bool:
        return bool_
    if x is int:
        return int64
    if x is float:
        return float32
    try:
        npd = np.dtype(x)
    except TypeError as e:
        raise UnsupportedDType(f"not a dtype: {x!r}") from e
    if npd in _BY_NP:
        return _BY_NP[npd]
    raise UnsupportedDType(
        f"dtype {npd} is not supported (supported: {', '.join(d.name for d in ALL)})"
    )


def result_type(*args: DType | int | float | bool) -> DType:
    """Promotion of array dtypes: NumPy's, Python scalars weak (NEP 50), with the
    default-float rule (module docstring).

    Pairs go through np.add's type resolution rather than np.result_type because
    ml_dtypes registers bfloat16's promotions as ufunc loops only.
    """
    arrays = [a for a in args if isinstance(a, DType)]
    return default_float_rule(numpy_result_type(*args), arrays) if arrays else \
        numpy_result_type(*args)  # fmt: skip


def numpy_result_type(*args: DType | int | float | bool) -> DType:
    """NumPy 2's promotion of array dtypes and weak Python scalars, unadjusted (the
    common dtype comparisons compare in)."""
    arrays = [a for a in args if isinstance(a, DType)]
    scalars = [a for a in args if not isinstance(a, DType)]
    if not arrays:
        return (
            scalar_dtype(scalars[0])
            if len(scalars) == 1
            else as_dtype(
                np.result_type(*[np.float32 if isinstance(v, float) else v for v in scalars])
            )
        )
    out = arrays[0]
    for d in arrays[1:]:
        if d != out:
            out = as_dtype(np.add.resolve_dtypes((out.np, d.np, None))[-1])
    for v in scalars:
        if isinstance(v, float) and not out.is_float:
            out = float64
        elif isinstance(v, int) and not isinstance(v, bool) and out == bool_:
            out = int64
    return out


def scalar_dtype(value: int | float | bool) -> DType:
    """The dtype a lone Python scalar gets when it becomes an array."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int64
    return float32
