"""C types of each dtype and the conversions between them, as C expression strings.

Storage type: what sits in memory. Compute type: what arithmetic runs in (f16/bf16 in
float, like the NumPy reference, which upcasts them to float32).
"""

from __future__ import annotations

import struct
from typing import Any

from pygpukit.ir import DType

STORAGE = {
    "float64": "double", "float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "int32": "int",
    "int64": "long long", "bool": "bool",
}  # fmt: skip
COMPUTE = {**STORAGE, "float16": "float", "bfloat16": "float"}


def storage(d: DType) -> str:
    return STORAGE[d.name]


def compute(d: DType) -> str:
    return COMPUTE[d.name]


def is_half(d: DType) -> bool:
    return d.name in ("float16", "bfloat16")


def load(code: str, d: DType) -> str:
    """A storage value as its compute type."""
    if d.name == "float16":
        return f"__half2float({code})"
    if d.name == "bfloat16":
        return f"__bfloat162float({code})"
    return code


def to_storage(code: str, src: DType, dst: DType) -> str:
    """A compute value of dtype src converted (rounded once) to dst's storage type."""
    if dst.name == "bool":
        return f"(({code}) != 0)"
    if is_half(dst):
        fn = "__double2half" if dst.name == "float16" else "__double2bfloat16"
        ffn = "__float2half_rn" if dst.name == "float16" else "__float2bfloat16_rn"
        if src.name in ("float32", "float16", "bfloat16"):
            return f"{ffn}({code})"
        return f"{fn}((double)({code}))"
    if dst.is_int and src.is_float:
        # Through int64 so that out-of-range values wrap like NumPy's casts on x86.
        return f"(({storage(dst)})(long long)({code}))"
    return f"(({storage(dst)})({code}))"


def to_compute(code: str, src: DType, dst: DType) -> str:
    """A compute value of src widened to dst's compute type (a promotion, never rounds)."""
    if compute(src) == compute(dst):
        return code
    if dst.name == "bool":
        return f"(({code}) != 0)"
    return f"(({compute(dst)})({code}))"


def round_through(code: str, src: DType, dst: DType) -> str:
    """An explicit cast: round to dst's storage, then continue in dst's compute type."""
    if compute(src) == compute(dst) and not is_half(dst):
        if src.name == dst.name or dst.is_float:
            return code
    return load(to_storage(code, src, dst), dst)


def literal(value: Any, d: DType) -> str:
    """A constant in d's compute type, bit-exact (inf and nan included)."""
    if d.name == "bool":
        return "true" if value else "false"
    if d.is_int:
        v = int(value)
        return (
            f"(({compute(d)}){v}LL)"
            if v >= -(2**63) + 1
            else f"(({compute(d)})(-{2**63 - 1}LL - 1))"
        )
    bits = struct.unpack("<Q", struct.pack("<d", float(value)))[0]
    # Hex bits through an unsigned literal: exact for -0.0, inf and nan alike.
    dbl = f"__longlong_as_double((long long)0x{bits:016x}ULL)"
    return dbl if compute(d) == "double" else f"((float){dbl})"
