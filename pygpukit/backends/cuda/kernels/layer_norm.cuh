// LayerNorm over the last axis: y = (x - mean) * rsqrt(var + eps) * w + b (biased variance,
// as torch.nn.LayerNorm). w and b may be null (then 1 and 0).
//
// With the row in registers (PGK_ITEMS > 0) the variance is the exact two-pass
// sum((x - mean)^2), free of the cancellation of E[x^2] - mean^2. The looping variant
// (PGK_ITEMS == 0) makes one pass of sums shifted by the row's first element, which keeps
// the E[d^2] - E[d]^2 cancellation small for rows with a large common offset.
#include "common.cuh"

#ifndef PGK_ITEMS
#define PGK_ITEMS 4
#endif
#ifndef PGK_W
#define PGK_W PGK_T
#endif
typedef PGK_W pgk_w;

PGK_DEVICE pgk_acc pgk_ln_rsqrt(pgk_acc x) {
  if constexpr (sizeof(pgk_acc) == 8) return rsqrt(x);
  else return rsqrtf(x);
}

extern "C" __global__ void __launch_bounds__(512) pgk_layer_norm(const pgk_t* __restrict__ x,
                                          const pgk_w* __restrict__ w,
                                          const pgk_w* __restrict__ b, pgk_t* __restrict__ y,
                                          int cols, float eps, long long x_stride,
                                          long long y_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  constexpr int V = PGK_VEC;
  __shared__ pgk_acc scratch[32];
  const long long r = blockIdx.x;
  x += r * x_stride;
  y += r * y_stride;
  const pgk_acc n = pgk_acc(cols);
#if PGK_ITEMS > 0
  pgk_acc v[PGK_ITEMS][V];
  pgk_acc s = 0;
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      auto t = pgk_load_stream<V>(x + c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[i][k] = pgk_acc_of(t.v[k]);
        s += v[i][k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = 0;
    }
  }
  const pgk_acc mean = pgk_block_sum(s, scratch) / n;
  pgk_acc q = 0;
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const pgk_acc d = (c < cols) ? v[i][k] - mean : pgk_acc(0);
      q += d * d;
    }
  }
  const pgk_acc inv = pgk_ln_rsqrt(pgk_block_sum(q, scratch) / n + pgk_acc(eps));
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      pgk_vec<pgk_w, V> wv, bv;
      if (w) wv = pgk_load<V>(w + c);
      if (b) bv = pgk_load<V>(b + c);
      pgk_vec<pgk_t, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        pgk_acc a = (v[i][k] - mean) * inv;
        if (w) a *= pgk_acc_of(wv.v[k]);
        if (b) a += pgk_acc_of(bv.v[k]);
        o.v[k] = pgk_from_acc<pgk_t>(a);
      }
      pgk_store<V>(y + c, o);
    }
  }
#else
  const pgk_acc shift = pgk_acc_of(x[0]);
  pgk_acc s = 0, q = 0;
  for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    auto t = pgk_load<V>(x + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const pgk_acc d = pgk_acc_of(t.v[k]) - shift;
      s += d;
      q += d * d;
    }
  }
  s = pgk_block_sum(s, scratch);
  q = pgk_block_sum(q, scratch);
  const pgk_acc dm = s / n;
  const pgk_acc var = max(q / n - dm * dm, pgk_acc(0));
  const pgk_acc mean = shift + dm;
  const pgk_acc inv = pgk_ln_rsqrt(var + pgk_acc(eps));
  for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    auto t = pgk_load<V>(x + c);
    pgk_vec<pgk_w, V> wv, bv;
    if (w) wv = pgk_load<V>(w + c);
    if (b) bv = pgk_load<V>(b + c);
    pgk_vec<pgk_t, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      pgk_acc a = (pgk_acc_of(t.v[k]) - mean) * inv;
      if (w) a *= pgk_acc_of(wv.v[k]);
      if (b) a += pgk_acc_of(bv.v[k]);
      o.v[k] = pgk_from_acc<pgk_t>(a);
    }
    pgk_store<V>(y + c, o);
  }
#endif
}
