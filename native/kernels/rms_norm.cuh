// RMSNorm over the last axis: y = x * rsqrt(mean(x^2) + eps) * w.
//
// With a residual pointer the kernel first forms h = x + res, rounds it to PGK_T and writes
// it as a second output (the next layer's residual stream), then normalises the rounded h,
// which is what an unfused `h = x + res; rms_norm(h)` in PGK_T computes.
// One block per row; PGK_ITEMS vectors per thread stay in registers (one read, one write);
// PGK_ITEMS == 0 loops for rows too long for registers (two reads).
#include "common.cuh"

#ifndef PGK_ITEMS
#define PGK_ITEMS 4
#endif
#ifndef PGK_W
#define PGK_W PGK_T
#endif
typedef PGK_W pgk_w;

PGK_DEVICE pgk_acc pgk_rsqrt(pgk_acc x) {
  if constexpr (sizeof(pgk_acc) == 8) return rsqrt(x);
  else return rsqrtf(x);
}

extern "C" __global__ void __launch_bounds__(512) pgk_rms_norm(const pgk_t* __restrict__ x,
                                        const pgk_t* __restrict__ res,
                                        const pgk_w* __restrict__ w, pgk_t* __restrict__ y,
                                        pgk_t* __restrict__ h_out, int cols, float eps,
                                        long long x_stride, long long res_stride,
                                        long long y_stride, long long h_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  constexpr int V = PGK_VEC;
  __shared__ pgk_acc scratch[32];
  const long long r = blockIdx.x;
  x += r * x_stride;
  y += r * y_stride;
  if (res) res += r * res_stride;
  if (h_out) h_out += r * h_stride;
#if PGK_ITEMS > 0
  pgk_acc v[PGK_ITEMS][V];
  pgk_acc ss = 0;
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      auto t = pgk_load_stream<V>(x + c);
      if (res) {
        auto u = pgk_load_stream<V>(res + c);
        pgk_vec<pgk_t, V> hs;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          hs.v[k] = pgk_from_acc<pgk_t>(pgk_acc_of(t.v[k]) + pgk_acc_of(u.v[k]));
          t.v[k] = hs.v[k];
        }
        if (h_out) pgk_store<V>(h_out + c, hs);
      }
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[i][k] = pgk_acc_of(t.v[k]);
        ss += v[i][k] * v[i][k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = 0;
    }
  }
  ss = pgk_block_sum(ss, scratch);
  const pgk_acc inv = pgk_rsqrt(ss / pgk_acc(cols) + pgk_acc(eps));
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      pgk_vec<pgk_t, V> o;
      if (w) {
        auto wv = pgk_load<V>(w + c);
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = pgk_from_acc<pgk_t>(v[i][k] * inv * pgk_acc_of(wv.v[k]));
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = pgk_from_acc<pgk_t>(v[i][k] * inv);
      }
      pgk_store<V>(y + c, o);
    }
  }
#else
  pgk_acc ss = 0;
  for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    auto t = pgk_load<V>(x + c);
    if (res) {
      auto u = pgk_load<V>(res + c);
#pragma unroll
      for (int k = 0; k < V; ++k)
        t.v[k] = pgk_from_acc<pgk_t>(pgk_acc_of(t.v[k]) + pgk_acc_of(u.v[k]));
      if (h_out) pgk_store<V>(h_out + c, t);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const pgk_acc a = pgk_acc_of(t.v[k]);
      ss += a * a;
    }
  }
  ss = pgk_block_sum(ss, scratch);
  const pgk_acc inv = pgk_rsqrt(ss / pgk_acc(cols) + pgk_acc(eps));
  for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    auto t = pgk_load<V>(x + c);
    if (res) {
      auto u = pgk_load<V>(res + c);
#pragma unroll
      for (int k = 0; k < V; ++k)
        t.v[k] = pgk_from_acc<pgk_t>(pgk_acc_of(t.v[k]) + pgk_acc_of(u.v[k]));
    }
    pgk_vec<pgk_t, V> o;
    if (w) {
      auto wv = pgk_load<V>(w + c);
#pragma unroll
      for (int k = 0; k < V; ++k)
        o.v[k] = pgk_from_acc<pgk_t>(pgk_acc_of(t.v[k]) * inv * pgk_acc_of(wv.v[k]));
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = pgk_from_acc<pgk_t>(pgk_acc_of(t.v[k]) * inv);
    }
    pgk_store<V>(y + c, o);
  }
#endif
}
