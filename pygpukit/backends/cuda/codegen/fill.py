"""arange: out[i] = start + step * i, in int64 when start and step are ints, else double,
then rounded once to the output dtype (as the NumPy reference computes it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pygpukit.ir import DType, dtypes

from . import cdtypes as ct
from .prelude import PRELUDE
from .source import KernelSource, stable_hash


@dataclass(frozen=True)
class ArangeSpec:
    dtype: DType
    integral: bool


@functools.lru_cache(maxsize=64)
def generate(spec: ArangeSpec) -> KernelSource:
    name = "pgk_arange_" + stable_hash(spec)
    t = "i64" if spec.integral else "double"
    src = dtypes.int64 if spec.integral else dtypes.float64
    store = ct.to_storage("(start + step * i)", src, spec.dtype)
    text = (
        f'extern "C" __global__ void {name}({ct.storage(spec.dtype)}* __restrict__ out, '
        f"i64 n, {t} start, {t} step) {{\n"
        "  PGK_PDL_ENTRY\n"
        "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n;"
        " i += (i64)gridDim.x * blockDim.x)\n"
        f"    out[i] = {store};\n}}\n"
    )
    return KernelSource(PRELUDE + text, name, "Pq" + ("qq" if spec.integral else "dd"))
