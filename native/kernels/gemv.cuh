// GEMV for decode: y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]), W row-major [N, K].
//
// One warp per output row n: each lane streams 16-byte vectors of W's row with PGK_UNROLL
// loads in flight before any arithmetic, so the kernel runs at memory bandwidth; x (a few
// KB) is served from L1/L2. grid.y walks the M rows of x (small M reuses W from L2).
#include "common.cuh"

#ifndef PGK_UNROLL
#define PGK_UNROLL 4
#endif
#ifndef PGK_WARPS
#define PGK_WARPS 8
#endif

extern "C" __global__ void __launch_bounds__(PGK_WARPS * 32)
    pgk_gemv(const pgk_t* __restrict__ x, const pgk_t* __restrict__ w,
             const pgk_t* __restrict__ bias, pgk_t* __restrict__ y, int n, int k,
             long long x_stride, long long w_stride, long long y_stride) {
  constexpr int V = PGK_VEC;
  constexpr int U = PGK_UNROLL;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * PGK_WARPS + (threadIdx.x >> 5);
  if (row >= n) return;
  const pgk_t* wr = w + (long long)row * w_stride;
  const pgk_t* xr = x + (long long)blockIdx.y * x_stride;
  pgk_acc acc = 0;
  const int nvec = k / V;
  int vi = lane;
  for (; vi + (U - 1) * 32 < nvec; vi += U * 32) {
    pgk_vec<pgk_t, V> wv[U], xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) wv[u] = pgk_load_stream<V>(wr + (long long)(vi + u * 32) * V);
#pragma unroll
    for (int u = 0; u < U; ++u) xv[u] = pgk_load<V>(xr + (long long)(vi + u * 32) * V);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) acc += pgk_acc_of(wv[u].v[e]) * pgk_acc_of(xv[u].v[e]);
  }
  for (; vi < nvec; vi += 32) {
    auto wv = pgk_load_stream<V>(wr + (long long)vi * V);
    auto xv = pgk_load<V>(xr + (long long)vi * V);
#pragma unroll
    for (int e = 0; e < V; ++e) acc += pgk_acc_of(wv.v[e]) * pgk_acc_of(xv.v[e]);
  }
  for (int e = nvec * V + lane; e < k; e += 32) acc += pgk_acc_of(wr[e]) * pgk_acc_of(xr[e]);
  acc = pgk_warp_sum(acc);
  if (lane == 0) {
    if (bias) acc += pgk_acc_of(bias[row]);
    y[(long long)blockIdx.y * y_stride + row] = pgk_from_acc<pgk_t>(acc);
  }
}
