"""The header every generated kernel starts with: types, math helpers, the error word."""

from __future__ import annotations

# Error codes written to the device error word (see backends/cuda/errorword.py).
ERR_INDEX = 1
ERR_NEG_POW = 2
# A key length attention reads from the device outside [0, seq]: kv_len, kv_start (the
# attention kernels write the kv_len code, or that code + 1 for kv_start).
ERR_KV_LEN = 3
ERR_KV_START = 4

PRELUDE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef long long i64;

// Every generated kernel opens with these (as the templates do, kernels/common.cuh):
// launched as a programmatic dependent it may start before the kernel ahead of it ends,
// so it waits for that kernel before touching memory, then lets the next one start.
__device__ __forceinline__ void pgk_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pgk_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
#define PGK_PDL_ENTRY pgk_pdl_wait(); pgk_pdl_trigger();

// NaN-propagating max/min, like np.maximum / np.max.
template <class T> __device__ __forceinline__ T pgk_max(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}
template <class T> __device__ __forceinline__ T pgk_min(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return a < b ? a : b;
}
__device__ __forceinline__ float pgk_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double pgk_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ float pgk_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ double pgk_gelu_tanh(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
__device__ __forceinline__ float pgk_gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x / 1.4142135623730951f));
}
__device__ __forceinline__ double pgk_gelu_erf(double x) {
  return 0.5 * x * (1.0 + erf(x / 1.4142135623730951));
}

// Python's floor division and modulo of floats, as NumPy's npy_divmod computes them: the
// quotient snapped to the nearest integer of (a - fmod(a, b)) / b, the remainder with the
// divisor's sign; b == 0 gives a / b and fmod's NaN.
#define PGK_DIVMOD(T, SUF)                                                              \
  __device__ __forceinline__ T pgk_divmod(T a, T b, T* modulus) {                       \
    T mod = fmod##SUF(a, b);                                                            \
    if (!b) { *modulus = mod; return a / b; }                                           \
    T div = (a - mod) / b;                                                              \
    if (mod) {                                                                          \
      if ((b < 0) != (mod < 0)) { mod += b; div -= (T)1; }                              \
    } else {                                                                            \
      mod = copysign##SUF((T)0, b);                                                     \
    }                                                                                   \
    T floordiv;                                                                         \
    if (div) {                                                                          \
      floordiv = floor##SUF(div);                                                       \
      if (div - floordiv > (T)0.5) floordiv += (T)1;                                    \
    } else {                                                                            \
      floordiv = copysign##SUF((T)0, a / b);                                            \
    }                                                                                   \
    *modulus = mod;                                                                     \
    return floordiv;                                                                    \
  }                                                                                     \
  __device__ __forceinline__ T pgk_floordiv(T a, T b) {                                 \
    if (!b) return a / b;                                                               \
    T m;                                                                                \
    return pgk_divmod(a, b, &m);                                                        \
  }                                                                                     \
  __device__ __forceinline__ T pgk_pymod(T a, T b) {                                    \
    if (!b) return fmod##SUF(a, b);                                                     \
    T m;                                                                                \
    pgk_divmod(a, b, &m);                                                               \
    return m;                                                                           \
  }
PGK_DIVMOD(float, f)
PGK_DIVMOD(double, )
#undef PGK_DIVMOD

// Records the first error of a launch sequence: code, the step's tag, the value, the extent.
__device__ __forceinline__ void pgk_error(i64* err, i64 code, i64 tag, i64 value, i64 extent) {
  if (atomicCAS((unsigned long long*)err, 0ULL, (unsigned long long)code) == 0ULL) {
    err[1] = tag;
    err[2] = value;
    err[3] = extent;
  }
}

// Integer power with NumPy's wraparound; a negative exponent is an error.
template <class T> __device__ __forceinline__ T pgk_ipow(T b, T e, i64* err, i64 tag) {
  if (e < 0) {
    pgk_error(err, 2, tag, (i64)e, 0);
    return 0;
  }
  T r = 1;
  while (e) {
    if (e & 1) r = (T)(r * b);
    b = (T)(b * b);
    e >>= 1;
  }
  return r;
}

// A dynamic index read from device memory, wrapped like NumPy and checked. Out of range
// is recorded and answers -1: the caller then touches no memory at all.
template <class T> __device__ __forceinline__ i64 pgk_dyn_index(const T* p, i64 size,
                                                                 i64* err, i64 tag) {
  i64 v = (i64)(*p);
  i64 w = v < 0 ? v + size : v;
  if (w < 0 || w >= size) {
    pgk_error(err, 1, tag, v, size);
    return -1;
  }
  return w;
}
"""
