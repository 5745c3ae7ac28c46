"""A fill with zeros on the CUDA backend is a memset, not a generated kernel (checked
without a GPU: the memset is applied to a poisoned byte buffer standing for the device):
its bytes are NumPy's zeros for every dtype, in the planned slot at its offset, on the
step's stream; -0.0 and other values keep the fill kernel."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pygpukit import _native
from pygpukit.backends.cuda import ew, ops_elementwise
from pygpukit.backends.cuda.context import contiguous
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.ir import dtypes
from pygpukit.passes import Step

BASE = 1 << 20  # the stand-in device address of byte 0 of `memory`


class _Storage:
    addr = BASE


class _Ctx:
    """What the zero fill reads of a StepContext: its stream and output slot."""

    stream = "step stream"

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def alloc_out(self, shape: tuple[int, ...], dtype: Any, what: str) -> DeviceValue:
        return DeviceValue(_Storage(), shape, contiguous(shape), self.offset, dtype)  # type: ignore[arg-type]


def _step(value: Any, shape: tuple[int, ...], dtype: Any) -> Step:
    return Step("full", {"shape": shape, "dtype": dtype.name, "value": value}, (), 0, shape,
                dtype, None)  # fmt: skip


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64", "int8",
                                  "uint8", "int32", "int64", "bool"])  # fmt: skip
@pytest.mark.parametrize("shape", [(3, 70), (1,), (0, 4)])
def test_zero_fill_is_a_memset_of_numpys_zeros(
    name: str, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = dtypes.as_dtype(name)
    memory = np.full(4096, 0xFF, np.uint8)  # poisoned, as PYGPUKIT_POISON leaves it
    calls: list[Any] = []

    def memset(ptr: int, value: int, nbytes: int, stream: Any = None) -> None:
        calls.append(stream)
        memory[ptr - BASE : ptr - BASE + nbytes] = value

    def no_kernel(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a zero fill compiled a kernel")

    monkeypatch.setattr(_native, "memset", memset)
    monkeypatch.setattr(ew, "make", no_kernel)
    offset = 3  # elements into the slot's block
    value = False if name == "bool" else (0.0 if name.startswith(("float", "bf")) else 0)
    run = ops_elementwise.plan_expr(_Ctx(offset), _step(value, shape, dtype), [], 0)  # type: ignore[arg-type]
    out = run([])
    assert out.shape == shape and out.dtype == dtype
    start = offset * dtype.itemsize
    want = np.zeros(shape, np.dtype(name) if name != "bfloat16" else np.uint16).tobytes()
    assert memory[start : start + len(want)].tobytes() == want
    assert (memory[:start] == 0xFF).all() and (memory[start + len(want) :] == 0xFF).all()
    assert calls == ([_Ctx.stream] if want else [])


@pytest.mark.parametrize("value", [-0.0, 7, 1.5, float("nan")])
def test_other_fills_keep_the_kernel(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    def make(ctx: Any, expr: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(expr)
        return lambda out, ins: None

    monkeypatch.setattr(ew, "make", make)
    monkeypatch.setattr(_native, "memset", lambda *a: pytest.fail("memset for a nonzero fill"))
    step = _step(value, (4,), dtypes.float32)
    ops_elementwise.plan_expr(_Ctx(0), step, [], 0)  # type: ignore[arg-type]
    assert made and made[0][0] == "const" and made[0][1] is value
    assert ops_elementwise.zero_bytes(0) and not ops_elementwise.zero_bytes(-0.0)
