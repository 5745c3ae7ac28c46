// Softmax and log-softmax over the last axis of a [rows, cols] array (row stride given).
//
// One block per row. With PGK_ITEMS > 0 the row is read once into registers (ITEMS
// vectors of PGK_VEC elements per thread), so the kernel moves the minimum: one read and
// one write. PGK_ITEMS == 0 serves rows too long for registers: an online max/sum pass
// plus a write pass (two reads).
#include "common.cuh"

#ifndef PGK_ITEMS
#define PGK_ITEMS 4
#endif

PGK_DEVICE pgk_acc pgk_softmax_exp(pgk_acc x) {
  if constexpr (sizeof(pgk_acc) == 8) return exp(x);
  else return __expf(x);
}
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
  pgk_acc v[PGK_ITEMS][V];
  pgk_acc m = -PGK_INF;
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      auto t = pgk_load_stream<V>(x + c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[i][k] = pgk_acc_of(t.v[k]);
        m = max(m, v[i][k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = -PGK_INF;
    }
  }
  m = pgk_block_max(m, scratch);
  pgk_acc s = 0;
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i)
#pragma unroll
    for (int k = 0; k < V; ++k) {
      // exp(-inf - m) is 0, so padded lanes drop out without a branch. log-softmax keeps
      // x - m itself, which stays exact where exp underflows to 0.
      const pgk_acc a = v[i][k] - m;
      const pgk_acc e = pgk_softmax_exp(a);
      v[i][k] = LOG ? a : e;
      s += e;
    }
  s = pgk_block_sum(s, scratch);
  const pgk_acc inv = pgk_acc(1) / s;
  const pgk_acc logs = pgk_softmax_log(s);
#pragma unroll
  for (int i = 0; i < PGK_ITEMS; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * V;
    if (c < cols) {
      pgk_vec<pgk_t, V> t;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        pgk_acc r;
        if constexpr (LOG) r = v[i][k] - logs;
        else r = v[i][k] * inv;
        t.v[k] = pgk_from_acc<pgk_t>(r);
      }
      pgk_store<V>(y + c, t);
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

extern "C" __global__ void __launch_bounds__(512) pgk_softmax(const pgk_t* __restrict__ x, pgk_t* __restrict__ y,
                                       int cols, long long x_row_stride,
                                       long long y_row_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const long long r = blockIdx.x;
  pgk_softmax_row<false>(x + r * x_row_stride, y + r * y_row_stride, cols);
}

extern "C" __global__ void __launch_bounds__(512) pgk_log_softmax(const pgk_t* __restrict__ x,
                                           pgk_t* __restrict__ y, int cols,
                                           long long x_row_stride, long long y_row_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const long long r = blockIdx.x;
  pgk_softmax_row<true>(x + r * x_row_stride, y + r * y_row_stride, cols);
}
