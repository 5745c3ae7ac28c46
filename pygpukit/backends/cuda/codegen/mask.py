"""Boolean masks: one block scans a 1-D bool mask in chunks of its threads, carrying the
running count of True elements from chunk to chunk.

  positions  out[k] = the index of the k-th True element (flatnonzero; `count` of them)
  ranks      out[i] = how many True elements come before element i (mask_rank)

One block is enough for a mask's scan next to the gather it feeds; the count the
positions kernel fills was read from the device before the op was recorded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .prelude import PRELUDE
from .source import KernelSource, stable_hash

THREADS = 1024
MODES = ("positions", "ranks")


@dataclass(frozen=True)
class MaskSpec:
    mode: str  # one of MODES


@functools.lru_cache(maxsize=8)
def generate(spec: MaskSpec) -> KernelSource:
    if spec.mode not in MODES:
        raise ValueError(f"mask kernel mode must be one of {MODES}, got {spec.mode!r}")
    name = "pgk_mask_" + spec.mode + "_" + stable_hash(spec)
    store = ("if (f && before < count) out[before] = i;" if spec.mode == "positions"
             else "if (i < n) out[i] = before;")  # fmt: skip
    text = f"""
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
    i64* __restrict__ out, const bool* __restrict__ mask, i64 n, i64 stride, i64 count) {{
  PGK_PDL_ENTRY
  __shared__ i64 warp_before[32];
  __shared__ i64 carry;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (i64 base = 0; base < n; base += blockDim.x) {{
    const i64 i = base + threadIdx.x;
    const i64 f = (i < n && mask[i * stride]) ? 1 : 0;
    i64 incl = f;  // inclusive count within the warp
    for (int d = 1; d < 32; d <<= 1) {{
      const i64 y = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += y;
    }}
    if (lane == 31) warp_before[warp] = incl;
    __syncthreads();
    if (warp == 0) {{  // the warps' totals, scanned into each warp's exclusive offset
      const i64 t = lane < nwarps ? warp_before[lane] : 0;
      i64 s = t;
      for (int d = 1; d < 32; d <<= 1) {{
        const i64 y = __shfl_up_sync(0xffffffffu, s, d);
        if (lane >= d) s += y;
      }}
      if (lane < nwarps) warp_before[lane] = s - t;
    }}
    __syncthreads();
    const i64 before = carry + warp_before[warp] + incl - f;
    {store}
    __syncthreads();  // every thread has read carry
    if (threadIdx.x == blockDim.x - 1) carry = before + f;
    __syncthreads();
  }}
}}
"""
    return KernelSource(PRELUDE + text, name, "PPqqq")
