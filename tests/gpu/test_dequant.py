"""dequant.cuh on the GPU: every format, scale form and output dtype, both vector widths
and the one-element fallback, against ir/quant.py's float64 dequantization rounded once
to the output dtype, element for element. The data spans every byte (fp8: subnormals and
zeros included, NaN patterns left out), int4 zero points are random, and the first scale
is chosen so that some element under it rounds differently when the product is first
rounded to float32 (the double rounding the kernel must not do)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pygpukit.backends.cuda.kernels import dequant
from pygpukit.ir.quant import QuantSpec, dequantize, pack_int4

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}

# (spec, scale form ("tensor" / "row" for fp8), n, k)
CASES = [
    (QuantSpec("int8"), "", 300, 1024),
    (QuantSpec("int8"), "", 37, 1000),
    (QuantSpec("int8"), "", 9, 77),  # odd K: one element a thread
    (QuantSpec("fp8"), "tensor", 300, 1024),
    (QuantSpec("fp8"), "row", 257, 516),  # K % 8 == 4: 4-byte vectors
    (QuantSpec("fp8", block=128), "", 300, 1000),  # partial edge blocks both ways
    (QuantSpec("int4", group=128), "", 300, 1024),
    (QuantSpec("int4", group=128, has_zero=True), "", 300, 1024),
    (QuantSpec("int4", group=64, has_zero=True), "", 129, 640),
    (QuantSpec("int4", group=16, has_zero=True), "", 65, 272),
    (QuantSpec("int4", group=8), "", 33, 200),
    (QuantSpec("int4", group=4, has_zero=True), "", 20, 172),  # one element a thread
]
IDS = ["int8", "int8-k1000", "int8-k77", "fp8-tensor", "fp8-row-k516", "fp8-b128",
       "int4-g128", "int4-g128-asym", "int4-g64-asym", "int4-g16-asym", "int4-g8",
       "int4-g4-asym"]  # fmt: skip


def round_once(x: np.ndarray, dtype: str) -> np.ndarray:
    """float64 x rounded once (to nearest even) to dtype. NumPy rounds float64 to float16
    and float32 directly; ml_dtypes goes to bfloat16 through float32 (twice), so bfloat16
    rounds its 8-bit significand on the float64 bits (normal range: the values here)."""
    if dtype != "bfloat16":
        return x.astype(NP[dtype])
    b = np.ascontiguousarray(x, np.float64).view(np.uint64)
    drop = np.uint64(45)  # 52 - 7 fraction bits
    half = np.uint64((1 << 44) - 1) + ((b >> drop) & np.uint64(1))
    r = (b + half) & ~np.uint64((1 << 45) - 1)
    return r.view(np.float64).astype(ml_dtypes.bfloat16)  # exact: 8 significant bits


def _arrays(rng: np.random.Generator, spec: QuantSpec, form: str, n: int, k: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:  # fmt: skip
    if spec.format == "int8":
        data = rng.integers(-128, 128, (n, k)).astype(np.int8)
        return data, rng.uniform(1e-3, 1e-1, n).astype(np.float32), None
    if spec.format == "fp8":
        b = rng.integers(0, 256, (n, k)).astype(np.uint8)
        b[:, ::5] &= 0x87  # exponent 0: subnormals and signed zeros
        b[(b & 0x7F) == 0x7F] ^= 0x01  # no NaN patterns
        shape = () if form == "tensor" else (n,) if form == "row" else spec.scale_shapes(n, k)[0]
        return b, rng.uniform(1e-3, 1e-1, shape).astype(np.float32), None
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    ng = k // spec.group
    zero = rng.integers(0, 16, (n, ng)).astype(np.uint8) if spec.has_zero else None
    z = int(zero[0, 0]) if zero is not None else 8
    q[0, 0] = z + 3 if z + 3 < 16 else z - 3  # a magnitude of 3 under the first scale
    return pack_int4(q), rng.uniform(1e-3, 1e-1, (n, ng)).astype(np.float32), zero


def _plant_double_rounding(rng: np.random.Generator, spec: QuantSpec, data: np.ndarray,
                           scale: np.ndarray, zero: np.ndarray | None, k: int,
                           dtype: str) -> None:  # fmt: skip
    """Set the first scale to one under which some element's product, rounded first to
    float32 and then to dtype, misses the product rounded once."""
    first = np.zeros_like(scale)
    first.flat[0] = 1.0
    vals = dequantize(spec, data, first, zero, k)
    vals = np.unique(np.abs(vals[vals != 0]))[:4096]
    chunk = max(1, 2_000_000 // len(vals))
    for _ in range(20):
        c = rng.uniform(1e-3, 1e-1, chunk).astype(np.float32).astype(np.float64)
        p = vals[None, :] * c[:, None]
        hit = (round_once(p, dtype) != p.astype(np.float32).astype(NP[dtype])).any(axis=1)
        if hit.any():
            scale.flat[0] = c[np.argmax(hit)]
            return
    raise AssertionError("no scale found that shows double rounding")


@pytest.mark.parametrize("dtype", list(NP))
@pytest.mark.parametrize(("spec", "form", "n", "k"), CASES, ids=IDS)
def test_dequantize_rounds_once(dev, rng, spec, form, n, k, dtype):
    data, scale, zero = _arrays(rng, spec, form, n, k)
    if dtype != "float32":
        _plant_double_rounding(rng, spec, data, scale, zero, k, dtype)
    ref = round_once(dequantize(spec, data, scale, zero, k), dtype)
    pw, ps = dev.put(data), dev.put(scale)
    pz = dev.put(zero) if zero is not None else 0
    out = dev.alloc(n * k * np.dtype(NP[dtype]).itemsize, 0)
    dequant.dequantize(pw, ps, out, spec, n, k, dtype, scale_numel=scale.size, zero=pz)
    got = dev.get(out, (n, k), NP[dtype])
    bits = np.uint32 if dtype == "float32" else np.uint16
    bad = np.argwhere(got.view(bits) != ref.view(bits))
    assert not len(bad), f"{len(bad)} elements differ, first at {bad[:5].tolist()}"


OFFSETS = [(0, 0, 8), (8, 0, 8), (4, 0, 4), (0, 8, 4), (2, 0, 0), (0, 4, 0)]


@pytest.mark.parametrize(("w_off", "out_off", "want"), OFFSETS)
def test_unaligned_addresses_take_narrower_vectors(dev, rng, w_off, out_off, want):
    """W or out at an address off the 16-byte grid: the widest vector that stays aligned
    (or one element a thread), with the same result."""
    spec, n, k, dtype = QuantSpec("int8"), 64, 512, "bfloat16"
    data, scale, _ = _arrays(rng, spec, "", n, k)
    pw, ps = dev.put(data, w_off), dev.put(scale)
    out = dev.alloc(n * k * 2, out_off)
    assert dequant.vector_bytes(spec, k, dtype, pw, out) == want
    dequant.dequantize(pw, ps, out, spec, n, k, dtype, scale_numel=n)
    got = dev.get(out, (n, k), NP[dtype])
    ref = round_once(dequantize(spec, data, scale, None, k), dtype)
    np.testing.assert_array_equal(got.view(np.uint16), ref.view(np.uint16))
