"""Sweep of row-kernel structures for the bandwidth-bound RMSNorm / softmax workloads.

Times, on the bench's workload (16384 x 8192 bf16, CUDA graph of 20 calls), a plain copy
kernel written the same way as the row kernels, RMSNorm and softmax in many shapes of one
template (threads per row, rows per block, load/store cache hints, row held raw or as
fp32, persistent grid with the next row prefetched into registers or a cp.async / TMA ring
in shared memory), next to the production launchers and torch's copy_. Each group runs in
its own process (a hang or a fault loses one group, not the sweep).

    python scripts/norm_sweep.py [--json out.json] [--groups A,B,...] [--inductor out.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

COLS = 8192
ROWS = 16384

SOURCE = r"""
#include <cuda_bf16.h>
#define NV (COLS / 8)
#define I (NV / G)
#define R (T / G)
#define NW (T / 32)
typedef unsigned int u32;
#define INFINITY __int_as_float(0x7f800000)
typedef unsigned long long u64;

__device__ __forceinline__ float lo(u32 u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(u32 u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ u32 pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<u32*>(&h);
}
__device__ __forceinline__ float ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ u64 evict_first_policy() {
  u64 p;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint4 ld16(const uint4* p, u64 pol) {
  uint4 r;
#if LD == 0
  r = *p;
#elif LD == 1
  r = __ldcs(p);
#elif LD == 2
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
#elif LD == 3
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#elif LD == 4
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#elif LD == 5
  r = __ldg(p);
#endif
  (void)pol;
  return r;
}
__device__ __forceinline__ void st16(uint4* p, uint4 v, u64 pol) {
#if ST == 0
  *p = v;
#elif ST == 1
  __stcs(p, v);
#elif ST == 2
  asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1,%2,%3,%4};"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#elif ST == 3
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol) : "memory");
#endif
  (void)pol;
}

template <bool MAX> __device__ __forceinline__ float wred(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, u) : v + u;
  }
  return v;
}

struct Scratch {
  float f[2][NW];
  float2 p[2][NW];
};

// Reduction over the G threads of a row: warp shuffles, then (G > 32) one shared-memory
// step. RED 1: one barrier, a ring of two buffers; RED 0: the two-barrier form.
template <bool MAX> __device__ __forceinline__ float gred(float v, Scratch& s, int& seq) {
  v = wred<MAX>(v);
#if G > 32
  constexpr int WPG = G / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int first = (threadIdx.x / G) * WPG;
#if RED == 1
  float* buf = s.f[seq & 1];
  ++seq;
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  v = buf[first];
#pragma unroll
  for (int k = 1; k < WPG; ++k) v = MAX ? fmaxf(v, buf[first + k]) : v + buf[first + k];
#else
  float* buf = s.f[0];
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  float r = lane < WPG ? buf[first + lane] : (MAX ? -INFINITY : 0.f);
  v = wred<MAX>(r);
  __syncthreads();
#endif
#endif
  return v;
}

// (max, sum of 2^(t - max)) pairs, log2 domain.
__device__ __forceinline__ void comb(float& m, float& s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  s = (m == M ? s : s * ex2(m - M)) + (m2 == M ? s2 : s2 * ex2(m2 - M));
  m = M;
}
__device__ __forceinline__ void pred(float& m, float& sum, Scratch& s, int& seq) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    comb(m, sum, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, sum, o));
#if G > 32
  constexpr int WPG = G / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int first = (threadIdx.x / G) * WPG;
  float2* buf = s.p[seq & 1];
  ++seq;
  if (lane == 0) buf[warp] = make_float2(m, sum);
  __syncthreads();
  float2 a = buf[first];
  m = a.x;
  sum = a.y;
#pragma unroll
  for (int k = 1; k < WPG; ++k) {
    a = buf[first + k];
    comb(m, sum, a.x, a.y);
  }
#endif
}

#define L2E 1.4426950408889634f

// One row slice (I vectors a thread) from registers to y.
__device__ __forceinline__ void process(uint4 (&v)[I], const uint4* __restrict__ w,
                                        uint4* __restrict__ y, float eps, Scratch& s, int& seq,
                                        u64 pol) {
#if OP == 0
#if CSYNC
  float d = gred<false>(lo(v[0].x), s, seq);
  if (d == 1e30f) v[0].x ^= 1u;
#endif
#pragma unroll
  for (int i = 0; i < I; ++i) st16(y + i * G, v[i], pol);
#elif OP == 1
#if WE
  uint4 wv[I];
#pragma unroll
  for (int i = 0; i < I; ++i) wv[i] = __ldg(w + i * G);
#endif
  float ss = 0.f;
#if RAW
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const u32 q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      ss = fmaf(lo(q[k]), lo(q[k]), ss);
      ss = fmaf(hi(q[k]), hi(q[k]), ss);
    }
  }
#else
  float f[I][8];
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const u32 q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[i][2 * k] = lo(q[k]);
      f[i][2 * k + 1] = hi(q[k]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) ss = fmaf(f[i][k], f[i][k], ss);
  }
#endif
  ss = gred<false>(ss, s, seq);
  const float inv = rsqrtf(ss * (1.f / COLS) + eps);
#pragma unroll
  for (int i = 0; i < I; ++i) {
#if !WE
    const uint4 wq = __ldg(w + i * G);
#else
    const uint4 wq = wv[i];
#endif
    const u32 wa[4] = {wq.x, wq.y, wq.z, wq.w};
    const u32 q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
    u32 o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#if RAW
      const float a = lo(q[k]), b = hi(q[k]);
#else
      const float a = f[i][2 * k], b = f[i][2 * k + 1];
#endif
      o[k] = pack(a * inv * lo(wa[k]), b * inv * hi(wa[k]));
    }
    st16(y + i * G, make_uint4(o[0], o[1], o[2], o[3]), pol);
  }
#elif OP == 2
#if RAW
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const u32 q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) m = fmaxf(m, fmaxf(lo(q[k]), hi(q[k])));
  }
  m *= L2E;
#if ONL
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const u32 q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) sum += ex2(fmaf(lo(q[k]), L2E, -m)) + ex2(fmaf(hi(q[k]), L2E, -m));
  }
  pred(m, sum, s, seq);
#else
  m = gred<true>(m, s, seq);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const u32 q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) sum += ex2(fmaf(lo(q[k]), L2E, -m)) + ex2(fmaf(hi(q[k]), L2E, -m));
  }
  sum = gred<false>(sum, s, seq);
#endif
  const float inv = __fdividef(1.f, sum);
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const u32 q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
    u32 o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      o[k] = pack(ex2(fmaf(lo(q[k]), L2E, -m)) * inv, ex2(fmaf(hi(q[k]), L2E, -m)) * inv);
    st16(y + i * G, make_uint4(o[0], o[1], o[2], o[3]), pol);
  }
#else
  // fp32 copies of the exponentials stay in registers (one exp per element).
  float e[I][8];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const u32 q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      e[i][2 * k] = lo(q[k]) * L2E;
      e[i][2 * k + 1] = hi(q[k]) * L2E;
      m = fmaxf(m, fmaxf(e[i][2 * k], e[i][2 * k + 1]));
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < I; ++i)
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      e[i][k] = ex2(e[i][k] - m);
      sum += e[i][k];
    }
  const float mloc = m;
  pred(m, sum, s, seq);
  const float scale = __fdividef(ex2(mloc - m), sum);
#pragma unroll
  for (int i = 0; i < I; ++i) {
    u32 o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = pack(e[i][2 * k] * scale, e[i][2 * k + 1] * scale);
    st16(y + i * G, make_uint4(o[0], o[1], o[2], o[3]), pol);
  }
#endif
#endif
}

__device__ __forceinline__ void load_row(uint4 (&v)[I], const uint4* __restrict__ p, u64 pol) {
#pragma unroll
  for (int i = 0; i < I; ++i) v[i] = ld16(p + i * G, pol);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* g) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
#if LD == 4
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(s), "l"(g));
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g));
#endif
}

extern "C" __global__ void __launch_bounds__(T, MINB)
    k(const uint4* __restrict__ x, const uint4* __restrict__ w, uint4* __restrict__ y, int rows,
      float eps) {
#if PDL
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  __shared__ Scratch s;
  int seq = 0;
  const u64 pol = (LD == 2 || ST == 3) ? evict_first_policy() : 0ull;
  const int t = threadIdx.x % G, g = threadIdx.x / G;
  const long long first = (long long)blockIdx.x * R + g;
#if MODE == 0
  uint4 v[I];
  load_row(v, x + first * NV + t, pol);
  process(v, w + t, y + first * NV + t, eps, s, seq, pol);
#elif MODE == 1
  // Persistent: the next row's loads are in flight while this row reduces and stores.
  const long long stride = (long long)gridDim.x * R;
  uint4 cur[I];
  if (first < rows) load_row(cur, x + first * NV + t, pol);
  for (long long row = first; row < rows; row += stride) {
    uint4 nxt[I];
    if (row + stride < rows) load_row(nxt, x + (row + stride) * NV + t, pol);
    process(cur, w + t, y + row * NV + t, eps, s, seq, pol);
#pragma unroll
    for (int i = 0; i < I; ++i) cur[i] = nxt[i];
  }
#elif MODE == 2
  // Persistent with a STAGES-deep cp.async ring; each thread reads back only what it copied.
  extern __shared__ uint4 ring[];
  uint4* mine = ring + g * NV + t;
  const long long stride = (long long)gridDim.x * R;
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    const long long r = first + st * stride;
    if (r < rows) {
#pragma unroll
      for (int i = 0; i < I; ++i) cp_async16(mine + st * R * NV + i * G, x + r * NV + t + i * G);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  int it = 0;
  for (long long row = first; row < rows; row += stride, ++it) {
    const long long r = row + (STAGES - 1) * stride;
    if (r < rows) {
      const int st = (it + STAGES - 1) % STAGES;
#pragma unroll
      for (int i = 0; i < I; ++i) cp_async16(mine + st * R * NV + i * G, x + r * NV + t + i * G);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1) : "memory");
    uint4 v[I];
    const int st = it % STAGES;
#pragma unroll
    for (int i = 0; i < I; ++i) v[i] = mine[st * R * NV + i * G];
    process(v, w + t, y + row * NV + t, eps, s, seq, pol);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#elif MODE == 3
  // Persistent with a STAGES-deep ring filled by TMA bulk copies (one row per block, R == 1).
  extern __shared__ __align__(128) uint4 ring[];
  __shared__ __align__(8) u64 bar[STAGES];
  const long long stride = gridDim.x;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int st = 0; st < STAGES; ++st)
      asm volatile("mbarrier.init.shared.b64 [%0], 1;"
                   ::"r"((unsigned)__cvta_generic_to_shared(&bar[st])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](long long r, int st) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[st]);
    const unsigned d = (unsigned)__cvta_generic_to_shared(ring + st * NV);
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;"
                 ::"r"(b), "r"(COLS * 2) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(d), "l"(x + r * NV), "r"(COLS * 2), "r"(b) : "memory");
  };
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES - 1; ++st)
      if (first + st * stride < rows) issue(first + st * stride, st);
  }
  int it = 0;
  for (long long row = first; row < rows; row += stride, ++it) {
    // The barrier inside the previous row's reduction means every thread has read the
    // stage this refills.
    if (threadIdx.x == 0 && row + (STAGES - 1) * stride < rows)
      issue(row + (STAGES - 1) * stride, (it + STAGES - 1) % STAGES);
    const int st = it % STAGES;
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[st]);
    const unsigned phase = (it / STAGES) & 1;
    asm volatile(
        "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n"
        " @!p bra W;\n}\n" ::"r"(b), "r"(phase) : "memory");
    uint4 v[I];
#pragma unroll
    for (int i = 0; i < I; ++i) v[i] = ring[st * NV + t + i * G];
    process(v, w + t, y + row * NV + t, eps, s, seq, pol);
  }
#endif
}

// Grid-stride copy, U vectors in flight a thread: the flat reference.
extern "C" __global__ void __launch_bounds__(T)
    kflat(const uint4* __restrict__ x, uint4* __restrict__ y, long long n) {
  const long long step = (long long)gridDim.x * T * 4;
  for (long long base = (long long)blockIdx.x * T * 4 + threadIdx.x; base < n; base += step) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = x[base + u * T];
#pragma unroll
    for (int u = 0; u < 4; ++u) y[base + u * T] = v[u];
  }
}
"""

DEFAULTS = dict(
    OP=1, T=512, G=512, LD=1, ST=0, RAW=1, RED=1, WE=1, ONL=1, MINB=1, PDL=1, MODE=0,
    STAGES=2, CSYNC=1,
)  # fmt: skip


def V(**kw: int) -> dict[str, int]:
    return {**DEFAULTS, **kw}


def variant_groups() -> dict[str, list[dict[str, int]]]:
    copy = [
        V(OP=0, CSYNC=0),
        V(OP=0),
        V(OP=0, LD=0),
        V(OP=0, ST=1),
        V(OP=0, T=256, G=256),
        V(OP=0, T=1024, G=1024),
        V(OP=0, T=128, G=128),
        V(OP=0, T=512, G=256),
        V(OP=0, PDL=0),
    ]
    rms = [
        V(),
        V(RAW=0),
        V(RED=0),
        V(WE=0),
        *[V(LD=ld) for ld in (0, 2, 3, 4, 5)],
        *[V(ST=st) for st in (1, 2, 3)],
        V(MINB=2),
        V(MINB=4),
        V(T=256, G=256),
        V(T=256, G=256, MINB=8),
        V(T=256, G=256, MINB=6),
        V(T=128, G=128),
        V(T=128, G=128, MINB=12),
        V(T=1024, G=1024),
        V(T=512, G=256),
        V(T=512, G=128),
        V(T=256, G=128),
        V(PDL=0),
    ]
    smx = [
        V(OP=2),
        V(OP=2, ONL=0),
        V(OP=2, RAW=0),
        *[V(OP=2, LD=ld) for ld in (0, 2, 4)],
        V(OP=2, ST=1),
        V(OP=2, MINB=4),
        V(OP=2, T=256, G=256),
        V(OP=2, T=256, G=256, MINB=8),
        V(OP=2, T=1024, G=1024),
        V(OP=2, T=512, G=256),
        V(OP=2, PDL=0),
    ]
    persist = [V(OP=op, MODE=1, T=t, G=t) for op in (0, 1, 2) for t in (512, 256)] + [
        V(OP=1, MODE=1, LD=4),
        V(OP=1, MODE=1, PDL=0),
        V(OP=1, MODE=1, MINB=3),
    ]
    cpasync = [
        V(OP=op, MODE=2, T=t, G=t, STAGES=s)
        for op in (0, 1, 2)
        for t, s in ((512, 2), (512, 3), (512, 4), (256, 3))
    ] + [V(OP=1, MODE=2, STAGES=3, LD=4)]
    cpasync += [V(OP=op, MODE=2, STAGES=3, MINB=3) for op in (1, 2)]
    # Three 512-thread blocks an SM (<= 40 registers): hints, reductions, occupancy 4.
    occ3 = [
        *[V(OP=0, MINB=3, LD=ld, ST=st) for ld in (0, 1) for st in (0, 1)],
        *[V(RED=0, MINB=3, LD=ld, ST=st) for ld in (0, 1) for st in (0, 1)],
        V(MINB=3),
        V(MINB=3, WE=0),
        V(RED=0, MINB=3, WE=0),
        V(RED=0, MINB=4, WE=0),
        *[V(OP=2, ONL=0, MINB=3, LD=ld, ST=st) for ld in (0, 1) for st in (0, 1)],
        V(OP=2, ONL=0, MINB=3, RED=0),
        V(OP=2, ONL=0, MINB=4),
        V(OP=2, ONL=0, T=256, G=256, MINB=5),
    ]
    tma = [V(OP=op, MODE=3, STAGES=s) for op in (0, 1, 2) for s in (2, 3, 4)]
    tma += [V(OP=op, MODE=3, STAGES=3, MINB=3) for op in (1, 2)]
    return {"copy": copy, "rms": rms, "softmax": smx, "persist": persist, "cpasync": cpasync,
            "tma": tma, "occ3": occ3}  # fmt: skip


def _name(d: dict[str, int]) -> str:
    op = ("copy", "rms", "softmax")[d["OP"]]
    diff = [f"{k}={v}" for k, v in d.items() if k != "OP" and DEFAULTS[k] != v]
    return op + (" " + " ".join(diff) if diff else "")


def _defines(d: dict[str, int]) -> str:
    return "".join(f"#define {k} {v}\n" for k, v in d.items()) + f"#define COLS {COLS}\n"


def _occupancy(fn: Any, threads: int, smem: int) -> int:
    regs = max(1, int(fn.num_regs))
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = 65536 // (per_warp * (threads // 32))
    by_smem = 233472 // (smem + int(fn.shared_bytes) + 1024)
    return max(1, min(by_regs, 2048 // threads, by_smem, 32))


def run_group(group: str, out: list[dict[str, Any]]) -> None:
    import torch

    import pygpukit._native as native
    from pygpukit.backends.cuda import toolchain
    from pygpukit.backends.cuda.kernels import loader
    from pygpukit.bench.kernels import time_graph

    torch.manual_seed(0)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(COLS, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    xf = x.float()
    refs = {
        0: x,
        1: (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)) * w.float(),
    }
    x3 = (xf * 3).to(torch.bfloat16)
    refs[2] = torch.softmax(x3.float(), -1)
    stream = lambda: int(torch.cuda.current_stream().cuda_stream)  # noqa: E731
    arch = toolchain.device_arch()
    for d in variant_groups()[group]:
        name = _name(d)
        row: dict[str, Any] = {"group": group, "variant": name, **d}
        try:
            src = _defines(d)
            fn = native.Module(loader.compile_source(src + SOURCE, arch, ("-std=c++17",)))
            fn = fn.get_function("k")
            t, g = d["T"], d["G"]
            smem = 0
            if d["MODE"] == 2:
                smem = d["STAGES"] * (t // g) * COLS * 2
            elif d["MODE"] == 3:
                smem = d["STAGES"] * COLS * 2
            if smem + int(fn.shared_bytes) > 48 * 1024:
                fn.set_max_dynamic_shared_memory(smem)
            occ = _occupancy(fn, t, smem)
            grid = ROWS // (t // g)
            if d["MODE"] != 0:
                grid = min(grid, occ * nsm)
            src_x = x3 if d["OP"] == 2 else x
            pdl = bool(d["PDL"])

            launch = (
                (grid,), (t,), "PPPif",
                (src_x.data_ptr(), w.data_ptr(), y.data_ptr(), ROWS, 1e-6), smem,
            )  # fmt: skip

            def call(i: int, fn: Any = fn, launch: Any = launch, pdl: bool = pdl) -> None:
                fn.launch(*launch, stream(), pdl=pdl)

            y.fill_(float("nan"))
            call(0)
            torch.cuda.synchronize()
            ref = refs[d["OP"]]
            err = float((y.double() - ref.double()).norm() / ref.double().norm())
            us = time_graph(call, 1)
            row.update(
                regs=int(fn.num_regs), local=int(fn.local_bytes), occ=occ, grid=grid,
                err=err, us=round(us, 2), gbs=round(2 * ROWS * COLS * 2 / us / 1e3, 1),
            )  # fmt: skip
        except Exception as exc:  # a variant that fails to build or run: report, go on
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        out.append(row)
        print(json.dumps(row), flush=True)


def run_reference(out: list[dict[str, Any]], inductor: str | None) -> None:
    """torch copy_, the production launchers and (optionally) torch.compile's kernels."""
    import torch

    import pygpukit._native as native
    from pygpukit.backends.cuda import toolchain
    from pygpukit.backends.cuda.kernels import loader, rms_norm, softmax
    from pygpukit.bench.kernels import time_graph

    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(COLS, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    s = lambda: int(torch.cuda.current_stream().cuda_stream)  # noqa: E731
    rows = {
        "torch copy_ 256 MiB": lambda i: y.copy_(x),
        "prod rms_norm": lambda i: rms_norm.rms_norm(
            x.data_ptr(), w.data_ptr(), y.data_ptr(), ROWS, COLS, 1e-6, "bfloat16", stream=s()
        ),
        "prod softmax": lambda i: softmax.softmax(
            x.data_ptr(), y.data_ptr(), ROWS, COLS, "bfloat16", stream=s()
        ),
    }
    src = _defines(V(OP=0, T=256, G=256, LD=0, CSYNC=0))
    arch = toolchain.device_arch()
    mod = native.Module(loader.compile_source(src + SOURCE, arch, ("-std=c++17",)))
    flat = mod.get_function("kflat")
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    n16 = ROWS * COLS * 2 // 16
    for mult in (4, 8, 16):
        rows[f"flat copy grid {mult}xSM"] = lambda i, m=mult: flat.launch(
            (m * nsm,), (256,), "PPq", (x.data_ptr(), y.data_ptr(), n16), 0, s(), pdl=True
        )
    for name, fn in rows.items():
        us = time_graph(fn, 1)
        out.append({"group": "ref", "variant": name, "us": round(us, 2),
                    "gbs": round(2 * ROWS * COLS * 2 / us / 1e3, 1)})  # fmt: skip
        print(json.dumps(out[-1]), flush=True)
    if inductor:
        _inductor(x, w, out, inductor)


def run_production(out: list[dict[str, Any]], old_rev: str | None) -> None:
    """The launchers as they stand (with their kernels' register counts) and, from git
    revision `old_rev`, the kernels they replaced, launched the same way."""
    import torch

    import pygpukit._native as native
    from pygpukit.backends.cuda import toolchain
    from pygpukit.backends.cuda.kernels import loader, rms_norm, softmax
    from pygpukit.bench.kernels import time_graph

    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(COLS, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    y, h = torch.empty_like(x), torch.empty_like(x)
    s = lambda: int(torch.cuda.current_stream().cuda_stream)  # noqa: E731
    p = (x.data_ptr(), w.data_ptr(), y.data_ptr())
    defines = {**loader.type_defines("bfloat16"), **loader.type_defines("bfloat16", "PGK_W")}
    defines.update(PGK_VEC=8, PGK_ITEMS=2)
    sdef = {**loader.type_defines("bfloat16"), "PGK_VEC": 8, "PGK_ITEMS": 2}
    calls: dict[str, tuple[Any, Any, int]] = {
        "prod rms_norm": (
            lambda i: rms_norm.rms_norm(*p, ROWS, COLS, 1e-6, "bfloat16", stream=s()),
            loader.get_function("rms_norm", "pgk_rms_norm", defines), 2,
        ),
        "prod rms_norm + residual, h out": (
            lambda i: rms_norm.rms_norm(
                *p, ROWS, COLS, 1e-6, "bfloat16", residual=res.data_ptr(), h_out=h.data_ptr(),
                stream=s(),
            ),
            loader.get_function("rms_norm", "pgk_rms_norm_add", defines), 4,
        ),
        "prod softmax": (
            lambda i: softmax.softmax(*p[::2], ROWS, COLS, "bfloat16", stream=s()),
            loader.get_function("softmax", "pgk_softmax", sdef), 2,
        ),
    }  # fmt: skip
    if old_rev:
        try:
            git = lambda f: subprocess.run(  # noqa: E731
                ["git", "show", f"{old_rev}:native/kernels/{f}.cuh"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            common = git("common")
            for fam, name, d in (
                ("rms_norm", "pgk_rms_norm", defines),
                ("softmax", "pgk_softmax", sdef),
            ):
                src = "".join(f"#define {k} {v}\n" for k, v in sorted(d.items()))
                src += git(fam).replace('#include "common.cuh"', common)
                fn = native.Module(
                    loader.compile_source(src, toolchain.device_arch(), ("-std=c++17",))
                )
                fn = fn.get_function(name)
                if fam == "rms_norm":
                    args = (*p[:1], 0, *p[1:], 0, COLS, 1e-6, COLS, COLS, COLS, COLS)
                    fmt = "PPPPPifqqqq"
                else:
                    args, fmt = (x.data_ptr(), y.data_ptr(), COLS, COLS, COLS), "PPiqq"
                call = lambda i, fn=fn, fmt=fmt, args=args: fn.launch(  # noqa: E731
                    (ROWS,), (512,), fmt, args, 0, s(), pdl=True
                )
                calls[f"{old_rev[:7]} {fam}"] = (call, fn, 2)
        except Exception as exc:  # no git history on this machine: skip the comparison
            print(f"old kernels unavailable: {type(exc).__name__}: {exc}", flush=True)
    for name, (call, fn, tensors) in calls.items():
        us = time_graph(call, 1)
        out.append({"group": "prod", "variant": name, "us": round(us, 2),
                    "gbs": round(tensors * ROWS * COLS * 2 / us / 1e3, 1),
                    "regs": int(fn.num_regs), "local": int(fn.local_bytes)})  # fmt: skip
        print(json.dumps(out[-1]), flush=True)


def _inductor(x: Any, w: Any, out: list[dict[str, Any]], path: str) -> None:
    import torch
    from torch._inductor.utils import run_and_get_code

    from pygpukit.bench.kernels import time_graph

    def rms(x: Any, w: Any) -> Any:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)

    def smx(x: Any) -> Any:
        return torch.softmax(x, -1)

    with open(path, "w") as f:
        for name, fn, args in (("rms", rms, (x, w)), ("softmax", smx, (x,))):
            comp = torch.compile(fn, dynamic=False)
            _, codes = run_and_get_code(comp, *args)
            f.write(f"===== {name}\n" + "\n".join(codes) + "\n")
            us = time_graph(lambda i, c=comp, a=args: c(*a), 1)
            out.append({"group": "ref", "variant": f"torch.compile {name}", "us": round(us, 2),
                        "gbs": round(2 * ROWS * COLS * 2 / us / 1e3, 1)})  # fmt: skip
            print(json.dumps(out[-1]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--groups", default=",".join(variant_groups()) + ",ref,prod")
    ap.add_argument("--inductor", help="write torch.compile's generated code here")
    ap.add_argument("--one", help="run one group in this process (internal)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--old", help="git revision of the kernels the prod group compares with")
    args = ap.parse_args()
    if args.one:
        out: list[dict[str, Any]] = []
        if args.one == "ref":
            run_reference(out, args.inductor)
        elif args.one == "prod":
            run_production(out, args.old)
        else:
            run_group(args.one, out)
        return
    results: list[dict[str, Any]] = []
    for group in args.groups.split(","):
        cmd = [sys.executable, __file__, "--one", group]
        if args.inductor and group == "ref":
            cmd += ["--inductor", args.inductor]
        if args.old and group == "prod":
            cmd += ["--old", args.old]
        try:
            p = subprocess.run(
                cmd, capture_output=True, text=True, timeout=args.timeout, env=os.environ
            )
            text, err = p.stdout, p.stderr if p.returncode else ""
        except subprocess.TimeoutExpired as exc:
            text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = f"group {group} timed out after {args.timeout} s"
        for line in text.splitlines():
            if line.startswith("{"):
                results.append(json.loads(line))
                print(line, flush=True)
        if err:
            print(f"[{group}] {err[-2000:]}", flush=True)
        if args.json:  # after every group, so a later timeout keeps what was measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
