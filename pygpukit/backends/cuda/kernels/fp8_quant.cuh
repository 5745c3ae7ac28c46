// Activations quantized to FP8 e4m3 for the FP8 tensor-core GEMM (fp8_quant.py): x [M, K]
// of PGK_T (row stride x_stride) becomes q [M, K] (e4m3 bytes, row stride q_stride) and
// float32 scales with x ~= e4m3(q) * scale. A group is PGK_FQG columns of one row (128: the
// GEMM's per-128 scales of a block-scaled weight) or, with PGK_FQG 0, the whole row (its
// per-row scales). Rows m_x .. m - 1 (the GEMM's rows padded to a multiple of 4) are zero:
// q 0, scale 1. Group (r, g)'s scale, amax / 448, goes to scale[g * s_col + r * s_row]
// (the layout cuBLASLt reads); q = e4m3(x * (448 / amax)) rounded to nearest even, so the
// largest magnitude of a group is 448 exactly (an all-zero group: scale 1, q 0).
//
// The conversion is cvt's on SM 8.9+ (pgk_e4m3x2); cvt to e4m3 does not exist before, and
// every template is compiled for sm_80 too, where pgk_e4m3 rounds with integer arithmetic
// (exact, the same bytes; the FP8 GEMM itself needs SM 8.9+).
#include "common.cuh"

#ifndef PGK_FQG
#define PGK_FQG 128  // columns per scale; 0: one scale per row
#endif
#ifndef PGK_QZERO
#define PGK_QZERO 0  // pgk_int4_e4m3: 1 with uint8 zero points per group, 0 symmetric (8)
#endif

// v as e4m3fn bits, rounded to nearest even; the sign from v. At and above 464 (halfway
// to the 480 e4m3fn lacks) it saturates to 448; NaN stays NaN (0x7F), so the GEMM's
// result does too.
PGK_DEVICE unsigned pgk_e4m3(float v) {
  const unsigned sign = (__float_as_uint(v) >> 24) & 0x80u;
  const float a = fabsf(v);
  if (a != a) return sign | 0x7Fu;
  if (a < 0.015625f) return sign | (unsigned)__float2int_rn(a * 512.0f);  // 2^-9 steps
  unsigned u = __float_as_uint(a);
  u += 0x7FFFFu + ((u >> 20) & 1u);     // round the mantissa to 3 bits, ties even
  const unsigned e = (u >> 23) - 120u;  // bias 127 -> 7
  const unsigned bits = (e << 3) | ((u >> 20) & 7u);
  return sign | (bits < 0x7Eu ? bits : 0x7Eu);  // 0x7F is NaN: saturate to 448
}

// 8 elements of a row from x + at: one 16-byte load where aligned, else element by element;
// columns at or past k read as 0.
PGK_DEVICE void pgk_fq_load(const pgk_t* __restrict__ x, long long at, int col, int k, bool vec,
                            float (&f)[8]) {
  if (vec && col + 8 <= k) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + at));
    const pgk_t* e = reinterpret_cast<const pgk_t*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = pgk_to_float(e[j]);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = col + j < k ? pgk_to_float(x[at + j]) : 0.0f;
}

// Two values as e4m3 bytes (a in the low byte): the conversion unit's cvt on SM 8.9+, one
// instruction for both (the integer rounding above took the kernel to a third of copy
// bandwidth on an H200), which rounds to nearest even and saturates at 448 as pgk_e4m3
// does; pgk_e4m3 on SM 8.x, which has no e4m3 cvt.
PGK_DEVICE unsigned pgk_e4m3x2(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short h;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(h) : "f"(b), "f"(a));
  return h;
#else
  return pgk_e4m3(a) | (pgk_e4m3(b) << 8);
#endif
}

// The 8 values times inv as e4m3 bytes to q + at (8 bytes; those past k dropped).
PGK_DEVICE void pgk_fq_store(unsigned char* __restrict__ q, long long at, int col, int k,
                             const float (&f)[8], float inv) {
  unsigned w[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; j += 2)
    w[j / 4] |= pgk_e4m3x2(f[j] * inv, f[j + 1] * inv) << (8 * (j % 4));
  if (col + 8 <= k) {
    *reinterpret_cast<uint2*>(q + at) = make_uint2(w[0], w[1]);
    return;
  }
  for (int j = 0; j < 8 && col + j < k; ++j) q[at + j] = (unsigned char)(w[j / 4] >> (8 * (j % 4)));
}

PGK_DEVICE float pgk_fq_amax8(const float (&f)[8]) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(f[j]));
  return m;
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_fp8_quant)
#if PGK_FQG == 128
// A half-warp per group (16 lanes x 8 columns), groups in row-major order over the grid.
// q's rows are 16-byte aligned (q_stride % 16 == 0), so the 8-byte stores are aligned.
extern "C" __global__ void __launch_bounds__(256)
    pgk_fp8_quant(const pgk_t* __restrict__ x, unsigned char* __restrict__ q,
                  float* __restrict__ scale, int m, int m_x, int k, long long x_stride,
                  long long q_stride, long long s_col, long long s_row, int vec) {
  pgk_pdl_wait();  // x is the kernel ahead's output
  pgk_pdl_trigger();
  const int per_row = (k + 127) / 128;
  const long long g = (long long)blockIdx.x * 16 + (threadIdx.x >> 4);
  const int lane = threadIdx.x & 15;
  const bool in = g < (long long)m * per_row;
  const int r = in ? (int)(g / per_row) : 0, gc = in ? (int)(g % per_row) : 0;
  const int col = gc * 128 + lane * 8;
  float f[8];
  if (in && r < m_x && col < k) {
    pgk_fq_load(x, (long long)r * x_stride + col, col, k, vec != 0, f);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = 0.0f;
  }
  float amax = pgk_fq_amax8(f);
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (!in) return;
  const float inv = amax > 0.0f ? 448.0f / amax : 1.0f;
  if (lane == 0) scale[gc * s_col + r * s_row] = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (col < k) pgk_fq_store(q, (long long)r * q_stride + col, col, k, f, inv);
}
#else
// A block per row: its amax, then the row again (from L1/L2) quantized.
extern "C" __global__ void __launch_bounds__(256)
    pgk_fp8_quant(const pgk_t* __restrict__ x, unsigned char* __restrict__ q,
                  float* __restrict__ scale, int m, int m_x, int k, long long x_stride,
                  long long q_stride, long long s_col, long long s_row, int vec) {
  pgk_pdl_wait();
  pgk_pdl_trigger();
  __shared__ float warp_max[8];
  (void)m;
  (void)s_col;
  const int r = blockIdx.x;
  const long long xr = (long long)r * x_stride, qr = (long long)r * q_stride;
  const int kx = r < m_x ? k : 0;  // a padding row reads nothing: all zero
  float amax = 0.0f;
  for (int col = threadIdx.x * 8; col < kx; col += 256 * 8) {
    float f[8];
    pgk_fq_load(x, xr + col, col, k, vec != 0, f);
    amax = fmaxf(amax, pgk_fq_amax8(f));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < 8; ++w) amax = fmaxf(amax, warp_max[w]);
  const float inv = amax > 0.0f ? 448.0f / amax : 1.0f;
  if (threadIdx.x == 0) scale[r * s_row] = amax > 0.0f ? amax / 448.0f : 1.0f;
  for (int col = threadIdx.x * 8; col < k; col += 256 * 8) {
    float f[8];
    if (kx) {
      pgk_fq_load(x, xr + col, col, k, vec != 0, f);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = 0.0f;
    }
    pgk_fq_store(q, qr + col, col, k, f, inv);
  }
}
#endif
#endif

// An int4 weight (ir/quant.py: [N, K/2] bytes, element k in byte k / 2, low nibble first;
// uint8 zero points [N, K/group] with PGK_QZERO, else 8) as the e4m3 values q - zero
// [N, K] (row stride k), for the FP8 GEMM with the weight's group scales (group 128 of K:
// cuBLASLt's per-128 scales). Every q - zero in [-15, 15] is exact in e4m3. A thread takes
// 16 bytes (32 elements, within one group since 32 divides the group; 32-bit indices, the
// host checks n * k / 32 < 2^31).
//
// Two elements an instruction, in f16: a pair of nibbles under the f16 1024 is 1024 + q,
// and one HFMA2 makes (1024 + q) / 256 - (1024 + zero) / 256 = (q - zero) / 2^8 exactly
// (4 + q / 256 has its ulp at 2^-8). Scaled by 2^-8, a value's f16 exponent field is its
// e4m3 one (biases 15 and 7), so bits 14..7 of the f16 are its e4m3 exponent and top 3
// mantissa bits (all an integer under 16 has) and bit 15 its sign; zero stays zero. A word
// of 8 nibbles costs about 27 instructions (the float path, one element at a time, 90).
#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_int4_e4m3)
// The 8 elements of a word as 8 e4m3 bytes (lo: elements 0-3, hi: 4-7).
PGK_DEVICE void pgk_int4_e4m3_word(unsigned w, __half2 zpair, unsigned& lo, unsigned& hi) {
  const __half2 inv = __halves2half2(__ushort_as_half(0x1C00), __ushort_as_half(0x1C00));  // 2^-8
  unsigned r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // nibbles i and i + 4: the halves of pair i
    const unsigned q = ((w >> (4 * i)) & 0x000F000Fu) | 0x64006400u;
    const __half2 v = __hfma2(*reinterpret_cast<const __half2*>(&q), inv, zpair);
    const unsigned b = *reinterpret_cast<const unsigned*>(&v);
    r[i] = ((b >> 7) & 0x007F007Fu) | ((b >> 8) & 0x00800080u);  // bytes 0 and 2
  }
  const unsigned u01 = __byte_perm(r[0], r[1], 0x6240), u23 = __byte_perm(r[2], r[3], 0x6240);
  lo = __byte_perm(u01, u23, 0x5410);
  hi = __byte_perm(u01, u23, 0x7632);
}

// With scale_t, the grid's first relay_blocks blocks copy the float32 group scales
// scale[row, g] (row stride scale_ld) to scale_t[g, row] (row stride scale_t_ld): the
// N-major per-128 scales cuBLASLt reads, made beside the conversion rather than by a
// transposing copy of their own a call (consecutive threads write consecutive rows).
// Copying them from the threads that start a group had made the conversion's threads
// wait on one more load: [11264 x 2048] 9.9 -> 13.9 us (H200).
extern "C" __global__ void __launch_bounds__(256)
    pgk_int4_e4m3(const unsigned char* __restrict__ w, const unsigned char* __restrict__ zero,
                  unsigned char* __restrict__ out, int n, int k, int group, int zero_ld,
                  const float* __restrict__ scale, float* __restrict__ scale_t, int scale_ld,
                  int scale_t_ld, int relay_blocks) {
  pgk_pdl_wait();  // out may be scratch the kernel ahead still reads
  pgk_pdl_trigger();
  if ((int)blockIdx.x < relay_blocks) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned groups = (unsigned)k / (unsigned)group;
    if (i >= (unsigned)n * groups) return;
    const unsigned g = i / (unsigned)n, row = i - g * (unsigned)n;
    scale_t[(size_t)g * scale_t_ld + row] = __ldg(scale + (size_t)row * scale_ld + g);
    return;
  }
  const unsigned t = (blockIdx.x - relay_blocks) * blockDim.x + threadIdx.x;
  const unsigned per_row = (unsigned)k / 32u;
  if (t >= (unsigned)n * per_row) return;
  const unsigned row = t / per_row, c32 = t - row * per_row;
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(w + (size_t)row * (k / 2)) + c32);
  const int z = PGK_QZERO ? zero[(size_t)row * zero_ld + c32 * 32 / group] : 8;
  (void)zero;
  (void)zero_ld;
  // -(1024 + zero) / 256 in both halves (exact: -(4 + zero / 256))
  const unsigned short zh = (unsigned short)(0xE400u | (unsigned)z);  // -(1024 + z) in f16
  const __half2 zpair = __hmul2(__halves2half2(__ushort_as_half(zh), __ushort_as_half(zh)),
                                __halves2half2(__ushort_as_half(0x1C00), __ushort_as_half(0x1C00)));
  const unsigned in[4] = {v.x, v.y, v.z, v.w};
  unsigned o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) pgk_int4_e4m3_word(in[i], zpair, o[2 * i], o[2 * i + 1]);
  uint4* dst = reinterpret_cast<uint4*>(out + (size_t)row * k + c32 * 32);
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}
#endif
