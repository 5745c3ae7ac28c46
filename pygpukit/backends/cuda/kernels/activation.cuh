// Elementwise activations over n contiguous elements, and SwiGLU over [rows, cols].
//   gelu_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   gelu_erf:  0.5 x (1 + erf(x / sqrt(2)))
//   silu:      x / (1 + exp(-x))
//   swiglu:    silu(gate) * up, gate and up with their own row strides, so the two halves
//              of one fused [rows, 2*cols] projection need no split copy.
// Grid-stride loops of PGK_VEC-element vectors (pointers 16-byte aligned, or PGK_VEC = 1);
// the last n % PGK_VEC elements go through block 0 one by one.
#include "common.cuh"

PGK_DEVICE pgk_acc pgk_gelu_tanh_f(pgk_acc x) {
  const pgk_acc k0 = pgk_acc(0.7978845608028654), k1 = pgk_acc(0.044715);
  if constexpr (sizeof(pgk_acc) == 8) return 0.5 * x * (1.0 + tanh(k0 * (x + k1 * x * x * x)));
  else return 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x)));
}
PGK_DEVICE pgk_acc pgk_gelu_erf_f(pgk_acc x) {
  if constexpr (sizeof(pgk_acc) == 8) return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
  else return 0.5f * x * (1.0f + erff(x * 0.70710678f));
}
PGK_DEVICE pgk_acc pgk_silu_f(pgk_acc x) {
  if constexpr (sizeof(pgk_acc) == 8) return x / (1.0 + exp(-x));
  else return x / (1.0f + __expf(-x));
}

#define PGK_UNARY(NAME, FN)                                                                  \
  extern "C" __global__ void NAME(const pgk_t* __restrict__ x, pgk_t* __restrict__ y,        \
                                  long long n) {                                             \
    pgk_pdl_wait(); /* launched as a programmatic dependent: see common.cuh */               \
    pgk_pdl_trigger();                                                                       \
    constexpr int V = PGK_VEC;                                                               \
    const long long nv = n / V;                                                              \
    const long long stride = (long long)gridDim.x * blockDim.x;                              \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) { \
      auto t = pgk_load_stream<V>(x + i * V);                                                \
      pgk_vec<pgk_t, V> o;                                                                   \
      _Pragma("unroll") for (int k = 0; k < V; ++k)                                          \
        o.v[k] = pgk_from_acc<pgk_t>(FN(pgk_acc_of(t.v[k])));                                \
      pgk_store<V>(y + i * V, o);                                                            \
    }                                                                                        \
    /* The n % V tail: handled by the first threads of block 0. */                           \
    if (blockIdx.x == 0 && threadIdx.x < n - nv * V) {                                       \
      const long long i = nv * V + threadIdx.x;                                              \
      y[i] = pgk_from_acc<pgk_t>(FN(pgk_acc_of(x[i])));                                      \
    }                                                                                        \
  }

PGK_UNARY(pgk_gelu_tanh, pgk_gelu_tanh_f)
PGK_UNARY(pgk_gelu_erf, pgk_gelu_erf_f)
PGK_UNARY(pgk_silu, pgk_silu_f)

// Block: x over column vectors, y over rows; grid.x over column chunks, grid.y over rows.
extern "C" __global__ void pgk_swiglu(const pgk_t* __restrict__ gate,
                                      const pgk_t* __restrict__ up, pgk_t* __restrict__ y,
                                      long long rows, int cols, long long gate_stride,
                                      long long up_stride, long long y_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  constexpr int V = PGK_VEC;
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= cols) return;
  for (long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y; r < rows;
       r += (long long)gridDim.y * blockDim.y) {
    auto g = pgk_load_stream<V>(gate + r * gate_stride + c);
    auto u = pgk_load_stream<V>(up + r * up_stride + c);
    pgk_vec<pgk_t, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k)
      o.v[k] = pgk_from_acc<pgk_t>(pgk_silu_f(pgk_acc_of(g.v[k])) * pgk_acc_of(u.v[k]));
    pgk_store<V>(y + r * y_stride + c, o);
  }
}
