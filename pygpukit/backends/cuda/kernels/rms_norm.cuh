// RMSNorm over the last axis: y = x * rsqrt(mean(x^2) + eps) * w.
//
// pgk_rms_norm_add first forms h = x + res, rounds it to PGK_T and writes it as a second
// output when h_out is given (the next layer's residual stream), then normalises the
// rounded h, which is what an unfused `h = x + res; rms_norm(h)` in PGK_T computes. It is
// a kernel of its own so that the plain form does not pay its registers.
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

// The row is held as stored (bf16/f16 take half the registers of fp32 copies) and
// converted where used. Resident blocks per SM the register allocation must allow: the
// kernel is latency bound unless about 48 KB of row loads are in flight per SM, so 512
// threads with 32 bytes each need three blocks (an H200 ran 16384x8192 bf16 at 80% of
// copy bandwidth with two, 97% with three); rows of 64+ bytes a thread fill an SM with two.
// Only 16-byte vectors of at most 32 bytes a thread with fp32 math are capped (40 registers
// at 512 threads); other variants keep the compiler's choice.
constexpr bool pgk_rms_capped = PGK_ITEMS > 0 && PGK_ITEMS <= 2 && sizeof(pgk_acc) == 4 &&
                                 PGK_VEC * sizeof(pgk_t) == 16;
constexpr int pgk_rms_min_blocks = pgk_rms_capped ? 3 : 1;

PGK_DEVICE pgk_acc pgk_rsqrt(pgk_acc x) {
  if constexpr (sizeof(pgk_acc) == 8) return rsqrt(x);
  else return rsqrtf(x);
}

template <int V> PGK_DEVICE pgk_vec<pgk_t, V> pgk_rms_add(const pgk_vec<pgk_t, V>& a,
                                                         const pgk_vec<pgk_t, V>& b) {
  pgk_acc h[V];
#pragma unroll
  for (int k = 0; k < V; ++k) h[k] = pgk_acc_of(a.v[k]) + pgk_acc_of(b.v[k]);
  return pgk_vec_from_acc<pgk_t>(h);
}

template <int V> PGK_DEVICE void pgk_rms_store(pgk_t* y, const pgk_w* w, int c,
                                               const pgk_vec<pgk_t, V>& t, pgk_acc inv) {
  pgk_acc o[V];
#pragma unroll
  for (int k = 0; k < V; ++k) o[k] = pgk_acc_of(t.v[k]) * inv;
  if (w) {
    const auto wv = pgk_load<V>(w + c);
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] *= pgk_acc_of(wv.v[k]);
  }
  pgk_store<V>(y + c, pgk_vec_from_acc<pgk_t>(o));
}

template <int V> PGK_DEVICE pgk_acc pgk_sum_squares(const pgk_vec<pgk_t, V>& t) {
  pgk_acc ss = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const pgk_acc a = pgk_acc_of(t.v[k]);
    ss += a * a;
  }
  return ss;
}

// x, res, y and h_out point at this block's row.
template <bool RES>
PGK_DEVICE void pgk_rms_norm_row(const pgk_t* __restrict__ x, const pgk_t* __restrict__ res,
                                 const pgk_w* __restrict__ w, pgk_t* __restrict__ y,
                                 pgk_t* __restrict__ h_out, int cols, float eps) {
  constexpr int V = PGK_VEC;
  __shared__ pgk_acc scratch[32];
  pgk_acc ss = 0;
#if PGK_ITEMS > 0
  pgk_vec<pgk_t, V> t[PGK_ITEMS];
  pgk_vec<pgk_t, V> u[RES ? PGK_ITEMS : 1];
  // Every load of the row is issued before any arithmetic.
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      t[i] = pgk_load<V>(x + c);
      if constexpr (RES) u[i] = pgk_load<V>(res + c);
    }
  }
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      if constexpr (RES) {
        t[i] = pgk_rms_add<V>(t[i], u[i]);
        if (h_out) pgk_store<V>(h_out + c, t[i]);
      }
      ss += pgk_sum_squares<V>(t[i]);
    }
  }
  ss = pgk_block_sum_once(ss, scratch);
  const pgk_acc inv = pgk_rsqrt(ss / pgk_acc(cols) + pgk_acc(eps));
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) pgk_rms_store<V>(y, w, c, t[i], inv);
  }
#else
  for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    auto t = pgk_load<V>(x + c);
    if constexpr (RES) {
      t = pgk_rms_add<V>(t, pgk_load<V>(res + c));
      if (h_out) pgk_store<V>(h_out + c, t);
    }
    ss += pgk_sum_squares<V>(t);
  }
  ss = pgk_block_sum_once(ss, scratch);
  const pgk_acc inv = pgk_rsqrt(ss / pgk_acc(cols) + pgk_acc(eps));
  for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    auto t = pgk_load<V>(x + c);
    if constexpr (RES) t = pgk_rms_add<V>(t, pgk_load<V>(res + c));
    pgk_rms_store<V>(y, w, c, t, inv);
  }
#endif
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_rms_norm)
extern "C" __global__ void __launch_bounds__(512, pgk_rms_min_blocks)
    pgk_rms_norm(const pgk_t* __restrict__ x, const pgk_t* __restrict__ res,
                 const pgk_w* __restrict__ w, pgk_t* __restrict__ y, pgk_t* __restrict__ h_out,
                 int cols, float eps, long long x_stride, long long res_stride,
                 long long y_stride, long long h_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const long long r = blockIdx.x;
  pgk_rms_norm_row<false>(x + r * x_stride, res, w, y + r * y_stride, h_out, cols, eps);
  (void)res_stride;
  (void)h_stride;
}
#endif

// The same with x + res first (res non-null; h_out may be null).
#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_rms_norm_add)
extern "C" __global__ void __launch_bounds__(512, pgk_rms_min_blocks)
    pgk_rms_norm_add(const pgk_t* __restrict__ x, const pgk_t* __restrict__ res,
                     const pgk_w* __restrict__ w, pgk_t* __restrict__ y,
                     pgk_t* __restrict__ h_out, int cols, float eps, long long x_stride,
                     long long res_stride, long long y_stride, long long h_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const long long r = blockIdx.x;
  pgk_rms_norm_row<true>(x + r * x_stride, res + r * res_stride, w, y + r * y_stride,
                         h_out ? h_out + r * h_stride : h_out, cols, eps);
}
#endif
