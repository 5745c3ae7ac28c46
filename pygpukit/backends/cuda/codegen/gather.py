"""take: out[pre, i..., post] = x[pre, idx[i...], post], bounds-checked on the device.

An index outside [-size, size) is recorded in the error word (raised as IndexError at the
next synchronisation) and its element is not read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pygpukit.ir import DType

from . import cdtypes as ct
from .prelude import PRELUDE
from .source import KernelSource, stable_hash


@dataclass(frozen=True)
class TakeSpec:
    dtype: DType
    idx_dtype: DType
    rank: int  # rank of the (collapsed) output iteration space


@functools.lru_cache(maxsize=256)
def generate(spec: TakeSpec) -> KernelSource:
    name = "pgk_take_" + stable_hash(spec)
    st = ct.storage(spec.dtype)
    decl = [f"{st}* __restrict__ out", f"const {st}* __restrict__ x",
            f"const {ct.storage(spec.idx_dtype)}* __restrict__ idx", "i64 n"]  # fmt: skip
    decl += [f"i64 s{d}" for d in range(spec.rank)]
    decl += [f"i64 xs{d}" for d in range(spec.rank)]
    decl += [f"i64 is{d}" for d in range(spec.rank)]
    decl += ["i64 axis_size", "i64 axis_stride", "i64* err", "i64 tag"]
    fmt = "PPPq" + "q" * (3 * spec.rank) + "qqPq"
    body = [
        "for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n;"
        " i += (i64)gridDim.x * blockDim.x) {",
        "  i64 r = i, xo = 0, io = 0;",
    ]
    for d in reversed(range(spec.rank)):
        c = f"r % s{d}" if d else "r"
        body.append(f"  {{ const i64 c = {c};" + (f" r /= s{d};" if d else ""))
        body.append(f"    xo += c * xs{d}; io += c * is{d}; }}")
    body += [
        "  const i64 v = (i64)idx[io];",
        "  const i64 w = v < 0 ? v + axis_size : v;",
        "  if (w < 0 || w >= axis_size) { pgk_error(err, 1, tag, v, axis_size); continue; }",
        "  out[i] = x[xo + w * axis_stride];",
        "}",
    ]
    text = (f'extern "C" __global__ void __launch_bounds__(256) {name}(\n    '
            + ",\n    ".join(decl) + ") {\n  PGK_PDL_ENTRY\n  " + "\n  ".join(body)
            + "\n}\n")  # fmt: skip
    return KernelSource(PRELUDE + text, name, fmt)
