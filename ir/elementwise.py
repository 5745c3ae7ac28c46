"""The elementwise ops, each declared once.

A declaration gives the op's name and kind, its dtype rule (the NumPy ufunc whose type
resolution it follows, or a rule of its own), its attributes, its NumPy reference (a NumPy
function over arrays in the compute precision, float64 included: a ufunc, a formula of
ir/reference.py, or a small function beside the declaration) and its CUDA expression.
Everything else is derived from this table: the IR op table (ir/ops.py), the expression IR
(ir/expr.py), evaluation on the NumPy backend and in constant folding (ir/evaluate.py), the
CUDA code generator and planner, and the public API (each entry of `api` must exist;
tests/test_op_registry.py checks that it records this op). A new op is its declaration
here, its public function in pygpukit/ops.py, and its test.

CUDA expressions are C templates over the operands {x}, {y}, {z}, each first converted as
the declaration's `operands` mode says:
  result  to the result dtype's compute type (float for f16/bf16)
  common  to the compute type of the inputs' promoted dtype (comparisons)
  raw     as loaded, in the operand's own compute type
  round   rounded to the result dtype, then in its compute type (a cast)
and the placeholders {f} (the float function suffix: "f" when the compute type is float,
"" for double), {ct} (the result's compute type), {err} (the error word and the step's tag,
for ops that can fail at run time) and each attribute by name (its C spelling). A template
may differ per result kind: a dict keyed by dtype kind letters ("f", "iu", "b"). Integer
results wrap at their own width after every op, like NumPy's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import reference, shapes
from .dtypes import DType, DTypeRuleError, as_dtype, bool_, resolve_ufunc, result_type
from .shapes import Shape

Spec = tuple[Shape, DType]
DTypeRule = Callable[[list[DType], dict[str, Any]], DType]
REQUIRED: Any = object()  # an attribute without a default
OPERAND_MODES = ("result", "common", "raw", "round")


@dataclass(frozen=True)
class Attr:
    """An attribute: its name, its default, and for attributes the CUDA template spells
    out, the allowed values and their C spelling."""

    name: str
    default: Any = REQUIRED
    cuda: tuple[tuple[Any, str], ...] = ()


@dataclass(frozen=True)
class Elementwise:
    """One elementwise op; see the module docstring for the fields' meaning."""

    name: str
    kind: str  # unary binary ternary cast (the IR's kinds; passes select on them)
    arity: int
    reference: Callable[..., Any]  # NumPy reference over compute-precision arrays
    cuda: str | dict[str, str]  # C expression template, or one per result dtype kind
    api: tuple[str, ...]  # public spellings: "exp", "nn.gelu", "GPUArray.__and__"
    ufunc: Any = None  # the NumPy ufunc whose type resolution (and errors) the op follows
    rule: DTypeRule | None = None  # a dtype rule of its own, instead of the ufunc's
    operands: str | tuple[str, ...] = "result"
    attrs: tuple[Attr, ...] = ()
    float_only: bool = False  # rejects integer and bool inputs (NumPy would promote them)
    bool_error: str = ""  # rejects all-bool inputs with this message
    on_bool: str = ""  # recorded instead when every operand is bool (same values)

    def operand_modes(self) -> tuple[str, ...]:
        """The conversion mode of each operand."""
        if isinstance(self.operands, str):
            return (self.operands,) * self.arity
        return self.operands

    def result_dtype(self, in_dtypes: list[DType], attrs: dict[str, Any]) -> DType:
        """The result dtype for these input dtypes, or DTypeRuleError."""
        if self.float_only:
            for d in in_dtypes:
                if not d.is_float:
                    raise DTypeRuleError(f"{self.name} needs a floating-point input, got {d}")
        if self.bool_error and all(d == bool_ for d in in_dtypes):
            raise DTypeRuleError(self.bool_error)
        if self.rule is not None:
            return self.rule(in_dtypes, attrs)
        return resolve_ufunc(self.ufunc, in_dtypes)

    def infer(self, ins: list[Spec], attrs: dict[str, Any]) -> Spec:
        """Shape (NumPy broadcasting of every operand) and dtype of the op."""
        shape = shapes.broadcast_shapes(*[s for s, _ in ins])
        return shape, self.result_dtype([d for _, d in ins], attrs)

    def attr_values(self, attrs: dict[str, Any]) -> tuple[Any, ...]:
        """The attributes in declared order, defaults filled in."""
        out = []
        for a in self.attrs:
            v = attrs.get(a.name, a.default)
            if v is REQUIRED:
                raise KeyError(f"{self.name} needs the attribute {a.name!r}")
            out.append(v)
        return tuple(out)

    def cuda_template(self, result: DType) -> str:
        """The C template for a result of this dtype."""
        if isinstance(self.cuda, str):
            return self.cuda
        for kinds, template in self.cuda.items():
            if result.kind in kinds:
                return template
        raise KeyError(f"no CUDA code for {self.name} with a {result} result")

    def cuda_attrs(self, values: tuple[Any, ...]) -> dict[str, str]:
        """Each attribute's C spelling, for the template."""
        out = {}
        for a, v in zip(self.attrs, values, strict=True):
            if a.cuda:
                spelled = dict(a.cuda)
                if v not in spelled:
                    raise KeyError(f"{self.name}: {a.name}={v!r} is not one of {list(spelled)}")
                out[a.name] = spelled[v]
        return out


OPS: dict[str, Elementwise] = {}


def declare(name: str, kind: str, **fields: Any) -> None:
    """Add an op to the registry."""
    arity = {"unary": 1, "cast": 1, "binary": 2, "ternary": 3}[kind]
    decl = Elementwise(name=name, kind=kind, arity=arity, **fields)
    if decl.rule is None and decl.ufunc is None:
        raise ValueError(f"{name}: a dtype rule or a ufunc is needed")
    if any(m not in OPERAND_MODES for m in decl.operand_modes()):
        raise ValueError(f"{name}: operand modes must be among {OPERAND_MODES}")
    OPS[name] = decl


def canonical(op: str, in_dtypes: list[DType]) -> str:
    """The op to record: its bool form when every operand is bool and it has one."""
    decl = OPS.get(op)
    if decl is not None and decl.on_bool and all(d == bool_ for d in in_dtypes):
        return decl.on_bool
    return op


# ---- unary: float results (integer inputs promote as NumPy's ufunc does) ----------------
for _name in ("exp", "log", "sqrt", "sin", "cos", "tanh"):
    _uf = getattr(np, _name)
    declare(_name, "unary", ufunc=_uf, reference=_uf, cuda=_name + "{f}({x})", api=(_name,))
declare("erf", "unary", ufunc=np.exp, reference=reference.erf, cuda="erf{f}({x})", api=("erf",))


def _rsqrt(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / np.sqrt(x)
    return out


declare(
    "rsqrt", "unary", ufunc=np.sqrt, reference=_rsqrt,
    cuda="(1.0{f} / sqrt{f}({x}))", api=("rsqrt",),
)  # fmt: skip
declare(
    "sigmoid", "unary", ufunc=np.exp, reference=reference.sigmoid,
    cuda="pgk_sigmoid({x})", api=("sigmoid",),
)  # fmt: skip


def _silu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x * reference.sigmoid(x)
    return out


declare(
    "silu", "unary", ufunc=np.exp, reference=_silu,
    cuda="({x} * pgk_sigmoid({x}))", api=("nn.silu",),
)  # fmt: skip
declare(
    "gelu", "unary", ufunc=np.exp, reference=reference.gelu,
    attrs=(Attr("approximate", "none", cuda=(("none", "erf"), ("tanh", "tanh"))),),
    cuda="pgk_gelu_{approximate}({x})", api=("nn.gelu",),
)  # fmt: skip


def _softplus(x: np.ndarray) -> np.ndarray:
    # log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): no overflow, no cancellation.
    out: np.ndarray = np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))
    return out


declare(
    "softplus", "unary", ufunc=np.exp, float_only=True, reference=_softplus,
    cuda="(fmax{f}({x}, 0.0{f}) + log1p{f}(exp{f}(-fabs{f}({x}))))", api=("softplus",),
)  # fmt: skip

# ---- unary: same kind as the input ------------------------------------------------------
declare(
    "neg", "unary", ufunc=np.negative, reference=np.negative,
    bool_error="negation of a bool array is not supported; use logical_not",
    cuda="-{x}", api=("negative", "GPUArray.__neg__"),
)  # fmt: skip
declare(
    "abs", "unary", ufunc=np.absolute, reference=np.absolute,
    cuda={"f": "fabs{f}({x})", "iu": "({x} < 0 ? -{x} : {x})", "b": "{x}"},
    api=("abs", "GPUArray.__abs__"),
)  # fmt: skip
declare(
    "logical_not", "unary", ufunc=np.logical_not, reference=np.logical_not, operands="raw",
    cuda="(!({x} != 0))", api=("logical_not",),
)  # fmt: skip
declare(
    "invert", "unary", ufunc=np.invert, reference=np.invert, on_bool="logical_not",
    cuda={"iu": "(~{x})", "b": "(!{x})"},
    api=("invert", "bitwise_invert", "GPUArray.__invert__"),
)  # fmt: skip

# ---- binary: arithmetic (on bools NumPy's add/maximum are or, mul/minimum and) ----------
declare(
    "add", "binary", ufunc=np.add, reference=np.add,
    cuda={"fiu": "{x} + {y}", "b": "({x} || {y})"},
    api=("add", "GPUArray.__add__", "GPUArray.__radd__"),
)  # fmt: skip
declare(
    "sub", "binary", ufunc=np.subtract, reference=np.subtract,
    bool_error="subtracting bool arrays is not supported",
    cuda="{x} - {y}", api=("subtract", "GPUArray.__sub__", "GPUArray.__rsub__"),
)  # fmt: skip
declare(
    "mul", "binary", ufunc=np.multiply, reference=np.multiply,
    cuda={"fiu": "{x} * {y}", "b": "({x} && {y})"},
    api=("multiply", "GPUArray.__mul__", "GPUArray.__rmul__"),
)  # fmt: skip
declare(
    "div", "binary", ufunc=np.true_divide, reference=np.true_divide,
    cuda="{x} / {y}", api=("divide", "GPUArray.__truediv__", "GPUArray.__rtruediv__"),
)  # fmt: skip
declare(
    "pow", "binary", ufunc=np.power, reference=np.power,
    cuda={"f": "pow{f}({x}, {y})", "iu": "pgk_ipow<{ct}>({x}, {y}, {err})"},
    api=("power", "GPUArray.__pow__", "GPUArray.__rpow__"),
)  # fmt: skip
# Python's floor division and modulo (the remainder takes the divisor's sign); integers
# divided by zero give 0 as NumPy's do, INT_MIN // -1 wraps. The float forms follow NumPy's
# npy_divmod (the prelude's pgk_floordiv / pgk_pymod); the integer forms are plain C, with
# the divisor 0 and -1 guarded before C's / and % (which trap on those).
_IDIV = "(({x} % {y} != 0) && (({x} % {y} < 0) != ({y} < 0)))"
declare(
    "floor_divide", "binary", ufunc=np.floor_divide, reference=np.floor_divide,
    cuda={"f": "pgk_floordiv({x}, {y})",
          "iu": "({y} == 0 ? 0 : {y} == -1 ? -{x} : {x} / {y} - " + _IDIV + ")"},
    api=("floor_divide", "GPUArray.__floordiv__", "GPUArray.__rfloordiv__"),
)  # fmt: skip
declare(
    "remainder", "binary", ufunc=np.remainder, reference=np.remainder,
    cuda={"f": "pgk_pymod({x}, {y})",
          "iu": "({y} == 0 || {y} == -1 ? 0 : {x} % {y} + (" + _IDIV + " ? {y} : 0))"},
    api=("remainder", "mod", "GPUArray.__mod__", "GPUArray.__rmod__"),
)  # fmt: skip
declare(
    "maximum", "binary", ufunc=np.maximum, reference=np.maximum,
    cuda={"fiu": "pgk_max<{ct}>({x}, {y})", "b": "({x} || {y})"}, api=("maximum",),
)  # fmt: skip
declare(
    "minimum", "binary", ufunc=np.minimum, reference=np.minimum,
    cuda={"fiu": "pgk_min<{ct}>({x}, {y})", "b": "({x} && {y})"}, api=("minimum",),
)  # fmt: skip

# ---- binary: comparisons, in the inputs' promoted dtype ---------------------------------
for _name, _uf, _sym, _api in (
    ("eq", np.equal, "==", ("equal", "GPUArray.__eq__")),
    ("ne", np.not_equal, "!=", ("not_equal", "GPUArray.__ne__")),
    ("lt", np.less, "<", ("less", "GPUArray.__lt__")),
    ("le", np.less_equal, "<=", ("less_equal", "GPUArray.__le__")),
    ("gt", np.greater, ">", ("greater", "GPUArray.__gt__")),
    ("ge", np.greater_equal, ">=", ("greater_equal", "GPUArray.__ge__")),
):
    declare(_name, "binary", ufunc=_uf, reference=_uf, operands="common",
            cuda="({x} " + _sym + " {y})", api=_api)  # fmt: skip

# ---- binary: logical (any dtypes, nonzero is true), bitwise (integers and bools) --------
declare(
    "logical_and", "binary", ufunc=np.logical_and, reference=np.logical_and, operands="raw",
    cuda="(({x} != 0) && ({y} != 0))", api=("logical_and",),
)  # fmt: skip
declare(
    "logical_or", "binary", ufunc=np.logical_or, reference=np.logical_or, operands="raw",
    cuda="(({x} != 0) || ({y} != 0))", api=("logical_or",),
)  # fmt: skip
# On two bools, & and | record their logical twins (same values), the form the mask
# patterns of passes/fuse_sdpa.py and the commutative ops of passes/cse.py know.
declare(
    "bitwise_and", "binary", ufunc=np.bitwise_and, reference=np.bitwise_and,
    on_bool="logical_and",
    cuda="({x} & {y})", api=("bitwise_and", "GPUArray.__and__", "GPUArray.__rand__"),
)  # fmt: skip
declare(
    "bitwise_or", "binary", ufunc=np.bitwise_or, reference=np.bitwise_or,
    on_bool="logical_or",
    cuda="({x} | {y})", api=("bitwise_or", "GPUArray.__or__", "GPUArray.__ror__"),
)  # fmt: skip
declare(
    "bitwise_xor", "binary", ufunc=np.bitwise_xor, reference=np.bitwise_xor,
    cuda="({x} ^ {y})", api=("bitwise_xor", "GPUArray.__xor__", "GPUArray.__rxor__"),
)  # fmt: skip


# ---- where and cast ---------------------------------------------------------------------
def _where_rule(ins: list[DType], attrs: dict[str, Any]) -> DType:
    if ins[0] != bool_:
        raise DTypeRuleError(f"where: condition must be bool, got {ins[0]}")
    return result_type(ins[1], ins[2])


def _cast_rule(ins: list[DType], attrs: dict[str, Any]) -> DType:
    return as_dtype(attrs["dtype"])


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    return x  # the rounding happens on the operand (mode "round")


declare(
    "where", "ternary", rule=_where_rule, reference=np.where,
    operands=("raw", "result", "result"), cuda="(({x}) ? {y} : {z})", api=("where",),
)  # fmt: skip
declare(
    "cast", "cast", rule=_cast_rule, reference=_cast, attrs=(Attr("dtype"),),
    operands="round", cuda="{x}", api=("astype", "GPUArray.astype"),
)  # fmt: skip
