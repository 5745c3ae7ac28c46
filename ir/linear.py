"""What a `linear` node computes, read once from its attrs and input count.

    y = act(prologue(x) @ w.T + bias) + residual

Inputs: x, w, [bias], [residual], [prologue operand: the RMSNorm gain, or SwiGLU's up].
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


@dataclass(frozen=True)
class LinearSpec:
    """The flags of one linear node: which optional inputs it has and what it applies."""

    has_bias: bool = False
    has_residual: bool = False
    prologue: str = "none"  # none | rms_norm | swiglu
    activation: str = "none"  # none | gelu_tanh | gelu_erf | silu
    glu: str = "none"  # none | swiglu
    eps: float = 0.0  # the rms_norm prologue's epsilon

    @classmethod
    def of(cls, attrs: Mapping[str, Any], n_inputs: int) -> LinearSpec:
        """The spec of a linear node with these attrs and n_inputs inputs (x and w first).
        The bias is the input left over once the residual and the prologue operand are
        counted. ShapeRuleError when the flags name an unknown prologue or do not fit."""
        prologue = attrs.get("prologue", "none")
        if prologue not in PROLOGUES:
            raise ShapeRuleError(f"linear: unknown prologue {prologue!r}")
        residual = bool(attrs.get("has_residual", False))
        n_bias = n_inputs - 2 - residual - (prologue != "none")
        if n_bias not in (0, 1):
            raise ShapeRuleError(f"linear takes {n_inputs} inputs that its flags do not fit")
        return cls(
            has_bias=n_bias == 1,
            has_residual=residual,
            prologue=prologue,
            activation=attrs.get("activation", "none"),
            glu=attrs.get("glu", "none"),
            eps=float(attrs.get("eps", 0.0)),
        )

    @property
    def residual_at(self) -> int:
        """The residual's input index (where it would be, without one)."""
        return 2 + self.has_bias

    @property
    def n_inputs(self) -> int:
        return 2 + self.has_bias + self.has_residual + (self.prologue != "none")

    def split(self, ins: Sequence[T]) -> LinearOperands[T]:
        """The inputs by role."""
        return LinearOperands(
            ins[0],
            ins[1],
            ins[2] if self.has_bias else None,
            ins[self.residual_at] if self.has_residual else None,
            ins[-1] if self.prologue != "none" else None,
        )
