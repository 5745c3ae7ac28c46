// Shared helpers for the NVRTC kernel templates.
//
// The launcher prepends `#define PGK_T <type>` (and sometimes more macros) and then the
// family file, which includes this one. Everything computes in PGK_ACC: float, except
// double for double inputs, so half/bf16 never accumulate in their own precision.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef PGK_T
#define PGK_T float
#endif

typedef PGK_T pgk_t;

#ifndef PGK_ACC
#define PGK_ACC float
#endif
typedef PGK_ACC pgk_acc;

// Elements per 16-byte vector access. The launcher sets PGK_VEC to 1 when a row start or
// a stride is not 16-byte aligned, so the same source serves aligned and unaligned data.
#ifndef PGK_VEC
#define PGK_VEC (16 / (int)sizeof(PGK_T))
#endif

#define PGK_DEVICE __device__ __forceinline__
#define PGK_INF __int_as_float(0x7f800000)

// ---------------------------------------------------------------- type conversion
PGK_DEVICE float pgk_to_float(float x) { return x; }
PGK_DEVICE float pgk_to_float(double x) { return (float)x; }
PGK_DEVICE float pgk_to_float(__half x) { return __half2float(x); }
PGK_DEVICE float pgk_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

PGK_DEVICE double pgk_to_double(float x) { return (double)x; }
PGK_DEVICE double pgk_to_double(double x) { return x; }
PGK_DEVICE double pgk_to_double(__half x) { return (double)__half2float(x); }
PGK_DEVICE double pgk_to_double(__nv_bfloat16 x) { return (double)__bfloat162float(x); }

// Converts any storage type to the accumulation type of this compilation.
template <typename A> struct pgk_load_as;
template <> struct pgk_load_as<float> {
  template <typename X> static PGK_DEVICE float cvt(X x) { return pgk_to_float(x); }
};
template <> struct pgk_load_as<double> {
  template <typename X> static PGK_DEVICE double cvt(X x) { return pgk_to_double(x); }
};
template <typename X> PGK_DEVICE pgk_acc pgk_acc_of(X x) { return pgk_load_as<pgk_acc>::cvt(x); }

template <typename T> PGK_DEVICE T pgk_from_float(float x);
template <> PGK_DEVICE float pgk_from_float<float>(float x) { return x; }
template <> PGK_DEVICE double pgk_from_float<double>(float x) { return (double)x; }
template <> PGK_DEVICE __half pgk_from_float<__half>(float x) { return __float2half_rn(x); }
template <> PGK_DEVICE __nv_bfloat16 pgk_from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T> PGK_DEVICE T pgk_from_acc(float x) { return pgk_from_float<T>(x); }
template <typename T> PGK_DEVICE T pgk_from_acc(double x);
template <> PGK_DEVICE double pgk_from_acc<double>(double x) { return x; }
template <> PGK_DEVICE float pgk_from_acc<float>(double x) { return (float)x; }
template <> PGK_DEVICE __half pgk_from_acc<__half>(double x) { return __double2half(x); }
template <> PGK_DEVICE __nv_bfloat16 pgk_from_acc<__nv_bfloat16>(double x) {
  return __double2bfloat16(x);
}

// Two accumulator values rounded to T and stored at o[0], o[1]; 16-bit types convert as a
// pair in one instruction (separate conversions also need a permute to pack the halves).
template <typename T, typename A> PGK_DEVICE void pgk_from_acc2(A a, A b, T* o) {
  o[0] = pgk_from_acc<T>(a);
  o[1] = pgk_from_acc<T>(b);
}
PGK_DEVICE void pgk_from_acc2(float a, float b, __nv_bfloat16* o) {
  *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(a, b);
}
PGK_DEVICE void pgk_from_acc2(float a, float b, __half* o) {
  *reinterpret_cast<__half2*>(o) = __floats2half2_rn(a, b);
}

// ---------------------------------------------------------------- vector access
// A bundle of N elements moved with the widest access the byte count allows. Callers
// guarantee alignment of sizeof(T) * N bytes (the launcher checks pointers and strides).
template <typename T, int N> struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) pgk_vec {
  T v[N];
};

// N accumulator values rounded into one vector of T.
template <typename T, int N, typename A> PGK_DEVICE pgk_vec<T, N> pgk_vec_from_acc(const A (&r)[N]) {
  pgk_vec<T, N> o;
#pragma unroll
  for (int k = 0; k + 1 < N; k += 2) pgk_from_acc2(r[k], r[k + 1], &o.v[k]);
  if constexpr (N % 2 != 0) o.v[N - 1] = pgk_from_acc<T>(r[N - 1]);
  return o;
}

template <int N, typename T> PGK_DEVICE pgk_vec<T, N> pgk_load(const T* p) {
  pgk_vec<T, N> r;
  constexpr int bytes = (int)sizeof(T) * N;
  if constexpr (bytes == 16) {
    *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
  } else if constexpr (bytes == 8) {
    *reinterpret_cast<uint2*>(&r) = *reinterpret_cast<const uint2*>(p);
  } else if constexpr (bytes == 4) {
    *reinterpret_cast<unsigned int*>(&r) = *reinterpret_cast<const unsigned int*>(p);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) r.v[i] = p[i];
  }
  return r;
}

template <int N, typename T> PGK_DEVICE void pgk_store(T* p, const pgk_vec<T, N>& r) {
  constexpr int bytes = (int)sizeof(T) * N;
  if constexpr (bytes == 16) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&r);
  } else if constexpr (bytes == 8) {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(&r);
  } else if constexpr (bytes == 4) {
    *reinterpret_cast<unsigned int*>(p) = *reinterpret_cast<const unsigned int*>(&r);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = r.v[i];
  }
}

// Streaming load for data read exactly once (bypasses L1 allocation, keeps L2 for reuse).
template <int N, typename T> PGK_DEVICE pgk_vec<T, N> pgk_load_stream(const T* p) {
  constexpr int bytes = (int)sizeof(T) * N;
  if constexpr (bytes == 16) {
    pgk_vec<T, N> r;
    *reinterpret_cast<uint4*>(&r) = __ldcs(reinterpret_cast<const uint4*>(p));
    return r;
  } else {
    return pgk_load<N>(p);
  }
}

// ---------------------------------------------------------------- reductions
template <typename A> PGK_DEVICE A pgk_warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename A> PGK_DEVICE A pgk_warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions; every thread gets the result. `scratch` needs 32 entries and
// may be reused right after the call returns (the trailing barrier protects it).
template <typename A> PGK_DEVICE A pgk_block_sum(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = pgk_warp_sum(v);
  if (nwarps == 1) return v;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A r = lane < nwarps ? scratch[lane] : A(0);
  r = pgk_warp_sum(r);
  __syncthreads();
  return r;
}

template <typename A> PGK_DEVICE A pgk_block_max(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = pgk_warp_max(v);
  if (nwarps == 1) return v;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A r = lane < nwarps ? scratch[lane] : A(-PGK_INF);
  r = pgk_warp_max(r);
  __syncthreads();
  return r;
}

// One-barrier forms for a kernel that reduces a fixed number of times: every call site
// passes its own `scratch` (32 entries, never written again), so no trailing barrier has to
// protect it. On the row kernels each barrier is on the critical path of every row.
template <typename A> PGK_DEVICE A pgk_block_sum_once(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = pgk_warp_sum(v);
  if (nwarps == 1) return v;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return pgk_warp_sum(lane < nwarps ? scratch[lane] : A(0));
}

template <typename A> PGK_DEVICE A pgk_block_max_once(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = pgk_warp_max(v);
  if (nwarps == 1) return v;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return pgk_warp_max(lane < nwarps ? scratch[lane] : A(-PGK_INF));
}

// ---------------------------------------------------------------- device scalars
// Dynamic values (decode position, context length) live in device memory so a captured
// CUDA graph stays valid across steps; a null pointer means "use the fallback".
PGK_DEVICE int pgk_read_i32(const int* p, int fallback) {
  return p ? __ldcg(p) : fallback;
}

// ------------------------------------------------------- GEMM / GEMV epilogue activation
// PGK_ACT (a family define; 0 when absent): 0 none, 1 GELU tanh, 2 GELU erf, 3 SiLU.
PGK_DEVICE float pgk_epilogue_act(float x) {
#if PGK_ACT == 1
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
#elif PGK_ACT == 2
  return 0.5f * x * (1.0f + erff(x * 0.70710678f));
#elif PGK_ACT == 3
  return x / (1.0f + __expf(-x));
#else
  return x;
#endif
}
PGK_DEVICE double pgk_epilogue_act(double x) {
#if PGK_ACT == 1
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
#elif PGK_ACT == 2
  return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
#elif PGK_ACT == 3
  return x / (1.0 + exp(-x));
#else
  return x;
#endif
}

// ------------------------------------------- programmatic dependent launch (SM90+)
// A kernel launched with programmatic stream serialization may start while the kernel
// before it still runs: it must pgk_pdl_wait() before it reads anything earlier work
// wrote or writes anything earlier work reads (the wait returns once that work has
// completed and its memory is visible). pgk_pdl_trigger() lets the next such kernel be
// scheduled before this one ends. Both are no-ops below SM 9.0 and without the attribute.
PGK_DEVICE void pgk_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
PGK_DEVICE void pgk_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// A hint only: the line is fetched into L2 (safe before pgk_pdl_wait -- the real read
// after it sees the latest data through the coherent L2).
PGK_DEVICE void pgk_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// ---------------------------------------------------------------- cp.async (SM80+)
PGK_DEVICE void pgk_cp_async16(void* smem, const void* gmem, bool pred) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  const int n = pred ? 16 : 0;  // src-size 0 zero-fills, so masked tiles read no memory
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
PGK_DEVICE void pgk_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> PGK_DEVICE void pgk_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ------------------------------------------ tensor-core fragments (mma.sync, SM80+)
template <typename A, typename B> struct pgk_same { static constexpr bool value = false; };
template <typename A> struct pgk_same<A, A> { static constexpr bool value = true; };

PGK_DEVICE void pgk_ldmatrix_x4(unsigned* r, const void* smem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

PGK_DEVICE void pgk_mma_16816(float* d, const unsigned* a, const unsigned* b) {
  if constexpr (pgk_same<pgk_t, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// ------------------------------------------------------- attention key ranges (prefill)
// Batch row b's live keys [start, len): len = *kv_len (null: seq_k), start =
// kv_start[b * kvs_stride] (null: 0); kv_wide bit 0 / bit 1 say kv_len / kv_start are
// int64 (else int32). A value outside [0, seq_k] is recorded in the error word when err
// is given (the caller passes it to one thread) as `code` with the value and seq_k, and
// clamped, so the kernel still touches only the keys it has.
PGK_DEVICE void pgk_attn_bounds(const int* kv_len, const int* kv_start, long long kvs_stride,
                                int kv_wide, int b, int seq_k, long long* err, long long tag,
                                long long code, int& len, int& start) {
  long long l_raw = seq_k, s_raw = 0;
  if (kv_len)
    l_raw = (kv_wide & 1) ? __ldcg(reinterpret_cast<const long long*>(kv_len)) : __ldcg(kv_len);
  if (kv_start)
    s_raw = (kv_wide & 2) ? __ldcg(reinterpret_cast<const long long*>(kv_start) + b * kvs_stride)
                          : __ldcg(kv_start + b * kvs_stride);
  const bool l_bad = l_raw < 0 || l_raw > seq_k, s_bad = s_raw < 0 || s_raw > seq_k;
  // code is the kv_len code; kv_start's is code + 1 (codegen/prelude.py: ERR_KV_*)
  if (err && (l_bad || s_bad) &&
      atomicCAS(reinterpret_cast<unsigned long long*>(err), 0ull,
                (unsigned long long)(l_bad ? code : code + 1)) == 0ull) {
    err[1] = tag;
    err[2] = l_bad ? l_raw : s_raw;
    err[3] = seq_k;
  }
  len = (int)min(max(l_raw, 0ll), (long long)seq_k);
  start = (int)min(max(s_raw, 0ll), (long long)seq_k);
}

// Query row i's visible keys [lo, hi) (empty when lo >= hi): its key-aligned position is
// pos = i + len - seq_q (the last query sits at key len - 1); causal hides keys after pos,
// a window w > 0 hides keys at or before pos - w (Mistral's sliding window).
PGK_DEVICE void pgk_attn_rows(int i, int seq_q, int len, int start, int causal, int window,
                              int& lo, int& hi) {
  const int pos = i + len - seq_q;
  hi = causal ? min(len, pos + 1) : len;
  lo = window > 0 ? max(start, pos - window + 1) : start;
}
