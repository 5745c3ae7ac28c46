"""What a `linear` node computes, read once from its attrs and input count.

    y = act(prologue(x) @ w.T + bias) + residual

Inputs: x, w, [scale], [zero], [bias], [residual], [prologue operand: the RMSNorm gain,
or SwiGLU's up]. With a `quant` attr (QuantSpec.attr) w is a quantized weight's packed
data, followed by its float32 scale and, for asymmetric int4, its zero points
(ir/quant.py owns the layouts); the weight then stands for dequantize(w, scale, zero).
The prologue is rms_norm(x, gain, eps) or silu(x) * up: the fusions of a decode step's
norms, gates and residual adds (passes/fold_into_linear.py). With glu == "swiglu" the
product's last axis is gate then up, and the node gives silu(gate) * up (half as wide)
before the residual: a gate/up projection and its gate (passes/fuse_gated_linear.py).

The shape rule, the passes and both backends read a node through LinearSpec.of, so the
flags are decoded in this one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .quant import QuantSpec
from .shapes import ShapeRuleError

PROLOGUES = ("none", "rms_norm", "swiglu")

T = TypeVar("T")


@dataclass(frozen=True)
class LinearOperands(Generic[T]):
    """A linear node's inputs by role (nodes, arrays or device values alike)."""

    x: T
    w: T
    bias: T | None
    residual: T | None
    prologue: T | None  # the RMSNorm gain or SwiGLU's up
    scale: T | None = None  # a quantized weight's scale
    zero: T | None = None  # an asymmetric int4 weight's zero points

    @property
    def weight(self) -> tuple[T, ...]:
        """The weight's inputs: w, then a quantized weight's scale and zero points."""
        return tuple(v for v in (self.w, self.scale, self.zero) if v is not None)


@dataclass(frozen=True)
class LinearSpec:
    """The flags of one linear node: which optional inputs it has and what it applies."""

    has_bias: bool = False
    has_residual: bool = False
    prologue: str = "none"  # none | rms_norm | swiglu
    activation: str = "none"  # none | gelu_tanh | gelu_erf | silu
    glu: str = "none"  # none | swiglu
    eps: float = 0.0  # the rms_norm prologue's epsilon
    quant: QuantSpec | None = None  # the weight's format, None for a float weight

    @classmethod
    def of(cls, attrs: Mapping[str, Any], n_inputs: int) -> LinearSpec:
        """The spec of a linear node with these attrs and n_inputs inputs (x and w first).
        The bias is the input left over once the weight's arrays, the residual and the
        prologue operand are counted. ShapeRuleError when the flags name an unknown
        prologue or do not fit."""
        prologue = attrs.get("prologue", "none")
        if prologue not in PROLOGUES:
            raise ShapeRuleError(f"linear: unknown prologue {prologue!r}")
        quant = QuantSpec.of_attr(attrs["quant"]) if attrs.get("quant") else None
        residual = bool(attrs.get("has_residual", False))
        n_weight = quant.n_arrays if quant is not None else 1
        n_bias = n_inputs - 1 - n_weight - residual - (prologue != "none")
        if n_bias not in (0, 1):
            raise ShapeRuleError(f"linear takes {n_inputs} inputs that its flags do not fit")
        return cls(
            has_bias=n_bias == 1,
            has_residual=residual,
            prologue=prologue,
            activation=attrs.get("activation", "none"),
            glu=attrs.get("glu", "none"),
            eps=float(attrs.get("eps", 0.0)),
            quant=quant,
        )

    @property
    def n_weight(self) -> int:
        """The weight's inputs: 1 for a float weight, data, scale [, zero] when quantized."""
        return self.quant.n_arrays if self.quant is not None else 1

    @property
    def bias_at(self) -> int:
        """The bias's input index (where it would be, without one)."""
        return 1 + self.n_weight

    @property
    def residual_at(self) -> int:
        """The residual's input index (where it would be, without one)."""
        return self.bias_at + self.has_bias

    @property
    def n_inputs(self) -> int:
        return self.residual_at + self.has_residual + (self.prologue != "none")

    def split(self, ins: Sequence[T]) -> LinearOperands[T]:
        """The inputs by role."""
        q = self.quant
        return LinearOperands(
            ins[0],
            ins[1],
            ins[self.bias_at] if self.has_bias else None,
            ins[self.residual_at] if self.has_residual else None,
            ins[-1] if self.prologue != "none" else None,
            ins[2] if q is not None else None,
            ins[3] if q is not None and q.has_zero else None,
        )

    def join(self, ops: LinearOperands[T]) -> list[T]:
        """The inputs in node order (the inverse of split)."""
        rest = (ops.bias, ops.residual, ops.prologue)
        return [ops.x, *ops.weight, *(v for v in rest if v is not None)]
