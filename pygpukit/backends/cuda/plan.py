"""Per-schedule launch plans: every step planned once (kernels compiled, shapes and strides
folded into argument tuples), so replaying a cached schedule only allocates outputs and
launches with this run's pointers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pygpukit.errors import GPUKitError, op_error
from pygpukit.passes import Schedule, Step

from . import ops_collective, ops_elementwise, ops_movement, ops_reduce
from .context import Context
from .kernels import (
    activation_plan,
    attention_plan,
    layer_norm_plan,
    linear_plan,
    paged_plan,
    rms_norm_plan,
    rope_plan,
    scan_plan,
    softmax_plan,
    sort_plan,
)
from .value import DeviceValue

Run = Callable[[Sequence[DeviceValue]], DeviceValue]
Planner = Callable[[Context, Step, Sequence[DeviceValue], int], Run]

# The fused kernel families: each plan module declares the IR ops it plans (PLANNERS).
FAMILY_PLANS = (activation_plan, attention_plan, layer_norm_plan, linear_plan, paged_plan,
                rms_norm_plan, rope_plan, scan_plan, softmax_plan, sort_plan)  # fmt: skip

PLANNERS: dict[str, Planner] = {
    **{op: ops_elementwise.plan_expr for op in ops_elementwise.ELEMENTWISE_OPS},
    "arange": ops_elementwise.plan_arange,
    **{op: ops_reduce.plan_reduce for op in ops_reduce.REDUCE_OPS},
    **{op: ops_movement.plan_view for op in ops_movement.VIEW_OPS},
    "concat": ops_movement.plan_concat,
    "take": ops_movement.plan_take,
    "flatnonzero": ops_movement.plan_mask_scan,
    "mask_rank": ops_movement.plan_mask_scan,
    "setitem": ops_movement.plan_setitem,
    **ops_collective.PLANNERS,
    **{op: planner for family in FAMILY_PLANS for op, planner in family.PLANNERS.items()},
}


def _specs(ins: Sequence[DeviceValue]) -> list[tuple[tuple[int, ...], Any]]:
    return [(v.shape, v.dtype) for v in ins]


def plan_step(ctx: Context, step: Step, ins: Sequence[DeviceValue]) -> Run:
    planner = PLANNERS.get(step.op)
    if planner is None:
        raise op_error(
            step.op,
            NotImplementedError(f"the CUDA backend has no kernel for {step.op!r}"),
            _specs(ins),
            step.loc,
        )
    tag = ctx.tag(step.op, _specs(ins), step.loc)
    try:
        return planner(ctx, step, ins, tag)
    except GPUKitError as e:
        if step.op in str(e) and "inputs:" in str(e):
            raise
        raise type(e)(f"{step.op}: {e} {_where(ins, step)}") from e
    except (ValueError, TypeError, IndexError, ArithmeticError) as e:
        raise op_error(step.op, e, _specs(ins), step.loc) from None


def _where(ins: Sequence[DeviceValue], step: Step) -> str:
    from pygpukit.errors import describe_inputs

    return describe_inputs(_specs(ins), step.loc)


def plan_for(schedule: Schedule, key: Any) -> dict[int, Any]:
    """The launch plans of a lazily run schedule for one set of input layouts, by id of
    the step (the schedule keeps its steps alive), filled on first execution."""
    plans: dict[int, Any] = schedule.info.setdefault("cuda_plans", {}).setdefault(key, {})
    return plans
