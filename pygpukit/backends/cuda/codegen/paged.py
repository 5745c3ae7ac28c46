"""The paged KV-cache kernels: paged_write (rows stored at block slots) and paged_sdpa
(attention through per-row block tables), as ir/ops.py defines them.

paged_sdpa runs one thread block per (row, head, query): the threads score the keys the
query sees (read through the block table) into shared memory, reduce max and sum, then
each thread accumulates output dimensions over the keys. Scores and the softmax are
float32. Lengths and block ids outside their ranges go to the error word (IndexError at
the next synchronisation); the kernel then skips them rather than read outside the pool.
The pools' blocks are PS elements apart (a block's KV heads contiguous): a pool of its own,
or the keys or values half of one pool holding both.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pygpukit.ir import DType

from . import cdtypes as ct
from .prelude import ERR_INDEX, PRELUDE
from .source import KernelSource, stable_hash

THREADS = 128


@dataclass(frozen=True)
class WriteSpec:
    dtype: DType  # the pool's
    new_dtype: DType
    slot_dtype: DType
    rope: str = "none"  # "half" / "interleaved": the first RH heads are stored rotated
    vec: int = 1  # elements of a row a thread stores (D a multiple of it)


@functools.lru_cache(maxsize=64)
def write_kernel(spec: WriteSpec) -> KernelSource:
    """out[blk, h, off, d] = new[t, h, d] for slot s = slots[t] >= 0 (blk = s / BS); with
    rope, heads h < RH rotated by the row's tables cos / sin [T, D / 2] (the pool's dtype),
    in the compute type, rounded once as the rope op rounds."""
    name = "pgk_paged_write_" + stable_hash(spec)
    st, nt, it = ct.storage(spec.dtype), ct.storage(spec.new_dtype), ct.storage(spec.slot_dtype)
    src = spec.new_dtype if spec.new_dtype.is_float else spec.dtype
    row = "rows[t * ns0 + h * ns1 + {d} * ns2]"
    val = ct.to_storage(ct.load(row.format(d="d"), spec.new_dtype), src, spec.dtype)
    rope_args, rope_fmt, store = "", "", f"out[dst] = {val};"
    if spec.rope != "none":
        cp = ct.compute(spec.dtype)
        if spec.rope == "half":
            pair = "const i64 j = d % (D / 2), dp = d < D / 2 ? d + D / 2 : d - D / 2;"
            first = "d < D / 2"
        else:
            pair = "const i64 j = d / 2, dp = d ^ 1;"
            first = "(d & 1) == 0"
        x = ct.load(row.format(d="d"), spec.new_dtype)
        xp = ct.load(row.format(d="dp"), spec.new_dtype)
        c = ct.load("cs[t * cs0 + j * cs1]", spec.dtype)
        sn = ct.load("sn[t * cs0 + j * cs1]", spec.dtype)
        rot = ct.to_storage("y", spec.dtype, spec.dtype)
        rope_args = (
            f", const {st}* __restrict__ cs, const {st}* __restrict__ sn, i64 RH, i64 cs0, i64 cs1"
        )
        rope_fmt = "PPqqq"
        store = f"""if (h < RH) {{
      {pair}
      const {cp} x = ({cp}){x}, xp = ({cp}){xp}, c = {c}, s = {sn};
      // The rope op's two forms: x1 c - x2 s (first of a pair), x2 c + x1 s (second).
      const {cp} y = {first} ? x * c - xp * s : x * c + xp * s;
      out[dst] = {rot};
    }} else {{
      out[dst] = {val};
    }}"""
    text = f"""
extern "C" __global__ void __launch_bounds__(256) {name}(
    {st}* __restrict__ out, const {nt}* __restrict__ rows, const {it}* __restrict__ slots,
    i64 T, i64 KV, i64 D, i64 BS, i64 nslots, i64 ns0, i64 ns1, i64 ns2, i64 ss, i64* err,
    i64 tag{rope_args}) {{
  PGK_PDL_ENTRY
  // {spec.vec} elements of a row a thread: the 64-bit index arithmetic (five divisions)
  // once for them all.
  const i64 n = T * KV * (D / {spec.vec});
  for (i64 iv = blockIdx.x * (i64)blockDim.x + threadIdx.x; iv < n;
       iv += (i64)gridDim.x * blockDim.x) {{
    const i64 i = iv * {spec.vec};
    const i64 t = i / (KV * D), h = (i / D) % KV, d0 = i % D;
    const i64 s = (i64)slots[t * ss];
    if (s < 0) continue;
    if (s >= nslots) {{
      if (h == 0 && d0 == 0) pgk_error(err, {ERR_INDEX}, tag, s, nslots);
      continue;
    }}
    const i64 dst0 = (((s / BS) * KV + h) * BS + s % BS) * D + d0;
#pragma unroll
    for (int e = 0; e < {spec.vec}; ++e) {{
      const i64 d = d0 + e, dst = dst0 + e;
      {store}
    }}
  }}
}}
"""
    return KernelSource(PRELUDE + text, name, "PPP" + "q" * 9 + "Pq" + rope_fmt)


@dataclass(frozen=True)
class AttendSpec:
    dtype: DType
    table_dtype: DType
    lens_dtype: DType


@functools.lru_cache(maxsize=64)
def attend_kernel(spec: AttendSpec) -> KernelSource:
    """out[b, h, t, :] = softmax(q . k[j] * scale, j <= lens[b] - T + t) @ v[j]."""
    name = "pgk_paged_sdpa_" + stable_hash(spec)
    st, tt, lt = ct.storage(spec.dtype), ct.storage(spec.table_dtype), ct.storage(spec.lens_dtype)
    f32 = DType_float32()

    def ld(code: str) -> str:
        return ct.load(code, spec.dtype)

    store = ct.to_storage("acc / total", f32, spec.dtype)
    zero = ct.to_storage("0.0f", f32, spec.dtype)
    text = f"""
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
    {st}* __restrict__ out, const {st}* __restrict__ q, const {st}* __restrict__ kp,
    const {st}* __restrict__ vp, const {tt}* __restrict__ table, const {lt}* __restrict__ lens,
    i64 H, i64 T, i64 D, i64 KV, i64 BS, i64 NB, i64 PS, i64 M, i64 qs0, i64 qs1, i64 qs2, i64 qs3,
    i64 ts0, i64 ts1, i64 ls, float scale, i64* err, i64 tag) {{
  PGK_PDL_ENTRY
  extern __shared__ float scores[];
  __shared__ float red[{THREADS}];
  const i64 bid = blockIdx.x;
  const i64 t = bid % T, h = (bid / T) % H, b = bid / (T * H);
  const i64 g = h / (H / KV);
  {st}* o = out + ((b * H + h) * T + t) * D;
  const {st}* qv = q + b * qs0 + h * qs1 + t * qs2;
  i64 len = (i64)lens[b * ls];
  if (len < 0 || len > M * BS) {{
    if (threadIdx.x == 0) pgk_error(err, {ERR_INDEX}, tag, len, M * BS);
    len = len < 0 ? 0 : M * BS;
  }}
  const i64 last = len - T + t;  // the query's position: it sees keys 0..last
  if (last < 0) {{
    for (i64 d = threadIdx.x; d < D; d += blockDim.x) o[d] = {zero};
    return;
  }}
  const i64 L = last + 1;
  float mx = -__int_as_float(0x7f800000);
  for (i64 j = threadIdx.x; j < L; j += blockDim.x) {{
    i64 blk = (i64)table[b * ts0 + (j / BS) * ts1];
    float s = -__int_as_float(0x7f800000);
    if (blk < 0 || blk >= NB) {{
      pgk_error(err, {ERR_INDEX}, tag, blk, NB);
    }} else {{
      const {st}* kr = kp + blk * PS + (g * BS + j % BS) * D;
      float acc = 0.0f;
      for (i64 d = 0; d < D; ++d) acc += {ld("qv[d * qs3]")} * {ld("kr[d]")};
      s = acc * scale;
    }}
    scores[j] = s;
    mx = fmaxf(mx, s);
  }}
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {{
    if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
    __syncthreads();
  }}
  mx = red[0];
  __syncthreads();
  float sum = 0.0f;
  for (i64 j = threadIdx.x; j < L; j += blockDim.x) {{
    const float p = scores[j] == -__int_as_float(0x7f800000) ? 0.0f : __expf(scores[j] - mx);
    scores[j] = p;
    sum += p;
  }}
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {{
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }}
  const float total = red[0] > 0.0f ? red[0] : 1.0f;
  for (i64 d = threadIdx.x; d < D; d += blockDim.x) {{
    float acc = 0.0f;
    for (i64 j = 0; j < L; ++j) {{
      const i64 blk = (i64)table[b * ts0 + (j / BS) * ts1];
      if (blk < 0 || blk >= NB) continue;
      acc += scores[j] * {ld("vp[blk * PS + (g * BS + j % BS) * D + d]")};
    }}
    o[d] = {store};
  }}
}}
"""
    fmt = "PPPPPP" + "q" * 15 + "fPq"
    return KernelSource(PRELUDE + text, name, fmt)


def DType_float32() -> DType:  # noqa: N802
    from pygpukit.ir import dtypes

    return dtypes.float32
