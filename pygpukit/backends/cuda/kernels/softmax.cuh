// Softmax and log-softmax over the last axis of a [rows, cols] array (row stride given).
//
// One block per row. With PGK_ITEMS > 0 the row is read once into registers (ITEMS
// vectors of PGK_VEC elements per thread, held as stored until the exponentials replace
// them), so the kernel moves the minimum: one read and one write. PGK_ITEMS == 0 serves rows too long for registers: an online max/sum pass
// plus a write pass (two reads).
#include "common.cuh"

#ifndef PGK_ITEMS
#define PGK_ITEMS 4
#endif

// Resident blocks per SM the register allocation must allow: see rms_norm.cuh (three
// 512-thread blocks of 32-byte slices keep enough loads in flight; an H200 ran
// 16384x8192 bf16 at 80% of copy bandwidth with two and 93% with three).
// Only 16-byte vectors of at most 32 bytes a thread with fp32 math are capped (40 registers
// at 512 threads); other variants keep the compiler's choice.
constexpr bool pgk_softmax_capped = PGK_ITEMS > 0 && PGK_ITEMS <= 2 && sizeof(pgk_acc) == 4 &&
                                 PGK_VEC * sizeof(pgk_t) == 16;
constexpr int pgk_softmax_min_blocks = pgk_softmax_capped ? 3 : 1;

PGK_DEVICE pgk_acc pgk_softmax_exp(pgk_acc x) {
  if constexpr (sizeof(pgk_acc) == 8) return exp(x);
  else return __expf(x);
}
// exp(x - m) for the register-held row. fp32: ex2.approx.ftz((x - m) * log2(e)), where
// __expf adds a denormal fix-up of four more instructions: this kernel issues enough per
// byte for that to show. Results below 2^-126 flush to 0, far below what any output
// resolves. (Folding m into an FFMA as x * log2(e) - m * log2(e) would save one more, but
// m * log2(e) overflows for |m| > 2.4e38.)
PGK_DEVICE float pgk_softmax_exp_sub(float x, float m) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"((x - m) * 1.4426950408889634f));
  return r;
}
PGK_DEVICE double pgk_softmax_exp_sub(double x, double m) { return exp(x - m); }
PGK_DEVICE pgk_acc pgk_softmax_log(pgk_acc x) {
  if constexpr (sizeof(pgk_acc) == 8) return log(x);
  else return __logf(x);
}

template <bool LOG>
PGK_DEVICE void pgk_softmax_row(const pgk_t* __restrict__ x, pgk_t* __restrict__ y,
                                int cols) {
  constexpr int V = PGK_VEC;
  __shared__ pgk_acc scratch[32];
#if PGK_ITEMS > 0
  __shared__ pgk_acc scratch_sum[32];
  pgk_vec<pgk_t, V> t[PGK_ITEMS];
  // Every load of the row is issued before any arithmetic.
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) t[i] = pgk_load<V>(x + c);
  }
  pgk_acc m = -PGK_INF;
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
#pragma unroll
      for (int k = 0; k < V; ++k) m = max(m, pgk_acc_of(t[i].v[k]));
    }
  }
  m = pgk_block_max_once(m, scratch);
  // softmax keeps the exponentials (the raw row dies with them); log-softmax needs only
  // their sum.
  pgk_acc e[LOG ? 1 : PGK_ITEMS][V];
  pgk_acc s = 0;
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const pgk_acc ek = pgk_softmax_exp_sub(pgk_acc_of(t[i].v[k]), m);
        if constexpr (!LOG) e[i][k] = ek;
        s += ek;
      }
    }
  }
  s = pgk_block_sum_once(s, scratch_sum);
  const pgk_acc inv = pgk_acc(1) / s;
  const pgk_acc logs = pgk_softmax_log(s);
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      pgk_acc r[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        // log-softmax keeps x - m itself, which stays exact where exp underflows to 0.
        if constexpr (LOG) r[k] = (pgk_acc_of(t[i].v[k]) - m) - logs;
        else r[k] = e[i][k] * inv;
      }
      pgk_store<V>(y + c, pgk_vec_from_acc<pgk_t>(r));
    }
  }
  (void)logs;
  (void)inv;
#else
  // Online pass: keep a running max and a sum rescaled whenever the max grows.
  pgk_acc m = -PGK_INF, s = 0;
  for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    auto t = pgk_load<V>(x + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const pgk_acc a = pgk_acc_of(t.v[k]);
      if (a > m) {
        s = s * pgk_softmax_exp(m - a) + 1;
        m = a;
      } else {
        s += pgk_softmax_exp(a - m);
      }
    }
  }
  const pgk_acc bm = pgk_block_max(m, scratch);
  s = (m == -PGK_INF) ? pgk_acc(0) : s * pgk_softmax_exp(m - bm);
  s = pgk_block_sum(s, scratch);
  const pgk_acc inv = pgk_acc(1) / s;
  const pgk_acc logs = pgk_softmax_log(s);
  for (int c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    auto t = pgk_load<V>(x + c);
    pgk_vec<pgk_t, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const pgk_acc a = pgk_acc_of(t.v[k]) - bm;
      pgk_acc r;
      if constexpr (LOG) r = a - logs;
      else r = pgk_softmax_exp(a) * inv;
      o.v[k] = pgk_from_acc<pgk_t>(r);
    }
    pgk_store<V>(y + c, o);
  }
#endif
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_softmax)
extern "C" __global__ void __launch_bounds__(512, pgk_softmax_min_blocks)
    pgk_softmax(const pgk_t* __restrict__ x, pgk_t* __restrict__ y, int cols,
                long long x_row_stride, long long y_row_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const long long r = blockIdx.x;
  pgk_softmax_row<false>(x + r * x_row_stride, y + r * y_row_stride, cols);
}
#endif

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_log_softmax)
extern "C" __global__ void __launch_bounds__(512, pgk_softmax_min_blocks)
    pgk_log_softmax(const pgk_t* __restrict__ x, pgk_t* __restrict__ y, int cols,
                    long long x_row_stride, long long y_row_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const long long r = blockIdx.x;
  pgk_softmax_row<true>(x + r * x_row_stride, y + r * y_row_stride, cols);
}
#endif
