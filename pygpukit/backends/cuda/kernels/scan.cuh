// Inclusive scans along the last axis of [rows, cols] (row strides given): running sums
// (pgk_cumsum) and products (pgk_cumprod), one block a row.
//
// The row is walked in tiles of blockDim.x elements. Each tile is scanned with warp
// shuffles, then the warp totals are scanned by warp 0 in shared memory; the carry of the
// tiles before is added and the tile's total becomes the next carry. Everything runs in
// PGK_SACC: float for f32/f16/bf16, double for f64, long long for integers and bools (whose
// results are int64, as NumPy's), so half inputs round once, at the store.
#include "common.cuh"

#ifndef PGK_OUT
#define PGK_OUT PGK_T
#endif
#ifndef PGK_SACC
#define PGK_SACC float
#endif
#ifndef PGK_SCAN_THREADS
#define PGK_SCAN_THREADS 512
#endif

typedef PGK_OUT pgk_out_t;
typedef PGK_SACC pgk_sacc;

template <typename X> PGK_DEVICE pgk_sacc pgk_scan_load(X x) { return (pgk_sacc)x; }
template <> PGK_DEVICE pgk_sacc pgk_scan_load<__half>(__half x) {
  return (pgk_sacc)__half2float(x);
}
template <> PGK_DEVICE pgk_sacc pgk_scan_load<__nv_bfloat16>(__nv_bfloat16 x) {
  return (pgk_sacc)__bfloat162float(x);
}

template <typename O> PGK_DEVICE O pgk_scan_store(pgk_sacc a) { return (O)a; }
// Half results only come from float accumulators (the cast is exact there).
template <> PGK_DEVICE __half pgk_scan_store<__half>(pgk_sacc a) {
  return __float2half_rn((float)a);
}
template <> PGK_DEVICE __nv_bfloat16 pgk_scan_store<__nv_bfloat16>(pgk_sacc a) {
  return __float2bfloat16_rn((float)a);
}

template <bool MUL> PGK_DEVICE pgk_sacc pgk_scan_op(pgk_sacc a, pgk_sacc b) {
  if constexpr (MUL) return a * b;
  else return a + b;
}

template <bool MUL>
PGK_DEVICE void pgk_scan_row(const pgk_t* __restrict__ x, pgk_out_t* __restrict__ y, int cols) {
  __shared__ pgk_sacc warp_total[32];
  const pgk_sacc identity = MUL ? (pgk_sacc)1 : (pgk_sacc)0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = (int)(blockDim.x >> 5);
  pgk_sacc carry = identity;
  for (int base = 0; base < cols; base += blockDim.x) {
    const int c = base + threadIdx.x;
    pgk_sacc v = c < cols ? pgk_scan_load(x[c]) : identity;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const pgk_sacc o = __shfl_up_sync(0xffffffffu, v, off);
      if (lane >= off) v = pgk_scan_op<MUL>(o, v);
    }
    if (lane == 31) warp_total[warp] = v;
    __syncthreads();
    if (warp == 0) {
      pgk_sacc t = lane < n_warps ? warp_total[lane] : identity;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const pgk_sacc o = __shfl_up_sync(0xffffffffu, t, off);
        if (lane >= off) t = pgk_scan_op<MUL>(o, t);
      }
      warp_total[lane] = t;
    }
    __syncthreads();
    const pgk_sacc before = warp > 0 ? pgk_scan_op<MUL>(carry, warp_total[warp - 1]) : carry;
    if (c < cols) y[c] = pgk_scan_store<pgk_out_t>(pgk_scan_op<MUL>(before, v));
    carry = pgk_scan_op<MUL>(carry, warp_total[n_warps - 1]);
    __syncthreads();  // every thread has read warp_total before the next tile rewrites it
  }
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_cumsum)
extern "C" __global__ void __launch_bounds__(PGK_SCAN_THREADS)
    pgk_cumsum(const pgk_t* __restrict__ x, pgk_out_t* __restrict__ y, int cols,
               long long x_row_stride, long long y_row_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const long long r = blockIdx.x;
  pgk_scan_row<false>(x + r * x_row_stride, y + r * y_row_stride, cols);
}
#endif

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_cumprod)
extern "C" __global__ void __launch_bounds__(PGK_SCAN_THREADS)
    pgk_cumprod(const pgk_t* __restrict__ x, pgk_out_t* __restrict__ y, int cols,
                long long x_row_stride, long long y_row_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const long long r = blockIdx.x;
  pgk_scan_row<true>(x + r * x_row_stride, y + r * y_row_stride, cols);
}
#endif
