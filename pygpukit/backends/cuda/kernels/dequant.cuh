// Dequantization of a weight in one of ir/quant.py's layouts into a dense [N, K] of PGK_T
// (float32, f16, bf16): the prefill path's scratch weight, which the GEMM then reads
// (linear_plan.py). Each element is the float64 dequantized value rounded once to PGK_T.
//   PGK_QFMT 0 int8 [N, K] (scale per row), 1 fp8 e4m3fn [N, K] (scale per tensor
//   (PGK_QTENSOR), per row, or per PGK_QGROUP x PGK_QGROUP block (PGK_QSK)), 2 int4
//   [N, K/2] (low nibble first; scale and, PGK_QZERO, uint8 zero point per group of
//   PGK_QGROUP along K; symmetric: zero 8). The macros are gemv_quant.py's `defines`.
//
// Bandwidth, not conversions: the kernel reads 1 (int4: 1/2) byte and writes 2 an element,
// so at copy speed an H200 must make about 5 elements per clock per SM. The e4m3 decode
// through ldexpf ran at half of copy speed (2.0-2.1 TB/s at the 7B shapes), so every step
// is an exact bit trick on the ALU and FMA pipes:
//   int8: the byte, offset to unsigned, under the float 2^23 (0x4B000000, one __byte_perm)
//         minus 2^23 + 128 is the integer (one FADD, exact);
//   int4: the nibble under 2^23 minus 2^23 + zero, likewise;
//   e4m3: sign to bit 31 and exponent-mantissa to bits 26-20 make the fp32 with the value
//         times 2^-120 (subnormals land on fp32 subnormals, exactly: no flush to zero in
//         the templates' options), times 2^120 is the value (exact).
// Then the one rounding: value * scale in round-to-odd (the truncated fp32 product with
// the sticky bit of its exact remainder, one FMA, in the last place), converted to f16/bf16
// rounding to nearest, is the exact product rounded once (fp32 holds more than 2 bits past
// either format's precision). float32 output is the plain product (rounded once).
//
// pgk_dequant: PGK_DQB bytes of W a vector (8 or 4: the host picks the widest whose
// output is at most 16 bytes and that its rows, pointers and groups allow), PGK_DQU
// vectors a thread, all loaded before any is converted; consecutive threads take
// consecutive vectors, so a warp's loads and its 16-byte stores are each contiguous.
// H200, the four 7B linears, us a layer (bf16 out; 32 bytes of W a thread -> 16 bytes a
// thread under registers for 8 blocks an SM): int8 173 -> 155, fp8 b128 161 -> 160, int4
// g128 148 -> 143, asymmetric 173 -> 152 (copy speed: int8 150, int4 125). Measured and
// set aside: 8 or 32 bytes a thread, streaming stores (st.global.cs), loads that skip L1
// with the 256-byte L2 hint (each within 3% of the kept form; both together gained int4
// what the register bound gains, not more, measured without it).
// pgk_dequant_each: one element a thread for any K and group (the fallback).
#include "common.cuh"

#include "quant_format.cuh"
#ifndef PGK_DQB
#define PGK_DQB 8  // bytes of W per vector: 8 or 4
#endif
#ifndef PGK_DQU
#define PGK_DQU 2  // vectors per thread
#endif
#ifndef PGK_DQMINB
#define PGK_DQMINB 8  // blocks of 256 an SM the registers must allow (__launch_bounds__)
#endif

// Elements of one vector.
#define PGK_DQE (PGK_QFMT == 2 ? 2 * PGK_DQB : PGK_DQB)

// The scale of element (row, col).
PGK_DEVICE float pgk_dq_scale(const float* __restrict__ scale, int row, int col, int scale_ld) {
#if PGK_QSK == 1
  const int grp = col / PGK_QGROUP;
  return PGK_QFMT == 1 ? scale[(long long)(row / PGK_QGROUP) * scale_ld + grp]
                       : scale[(long long)row * scale_ld + grp];
#else
  (void)col;
  (void)scale_ld;
  return PGK_QTENSOR ? scale[0] : scale[row];
#endif
}

// 2^23 + z as a float, exactly (z < 2^23): the magic the integers are read under.
PGK_DEVICE float pgk_dq_magic(unsigned z) { return __uint_as_float(0x4B000000u | z); }

// Element j (0-3) of an int8 word already XORed with 0x80808080: byte + 128 under 2^23.
PGK_DEVICE float pgk_dq_int8(unsigned x, int j) {
  return __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7540u | (unsigned)j)) -
         pgk_dq_magic(128u);
}

// Element j (0-3) of a word of e4m3fn bytes (S EEEE MMM, bias 7), exactly.
PGK_DEVICE float pgk_dq_e4m3(unsigned w, int j) {
  const unsigned b = (w >> (8 * j)) & 0xFFu;
  const unsigned bits = ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20);
  return __uint_as_float(bits) * 0x1p120f;
}

// Element j (0-7) of a word of nibbles, minus the zero point under the magic `zm`.
PGK_DEVICE float pgk_dq_int4(unsigned w, int j, float zm) {
  return __uint_as_float(((w >> (4 * j)) & 0xFu) | 0x4B000000u) - zm;
}

// q * s rounded to odd in fp32: with at least two bits to spare over PGK_T's precision,
// rounding this to nearest is q * s rounded once.
PGK_DEVICE float pgk_dq_odd(float q, float s) {
  const float p = __fmul_rz(q, s);
  const float rem = __fmaf_rn(q, s, -p);  // exact: the remainder of a product
  return __uint_as_float(__float_as_uint(p) | (rem != 0.0f ? 1u : 0u));
}

// Two values q * s in PGK_T, each rounded once, as the 2-element storage of PGK_T.
template <typename T> struct pgk_dq_out;
template <> struct pgk_dq_out<float> {
  static PGK_DEVICE void put(float* o, float a, float b, float s) {
    o[0] = a * s;
    o[1] = b * s;
  }
};
template <> struct pgk_dq_out<__nv_bfloat16> {
  static PGK_DEVICE void put(__nv_bfloat16* o, float a, float b, float s) {
    *reinterpret_cast<__nv_bfloat162*>(o) =
        __floats2bfloat162_rn(pgk_dq_odd(a, s), pgk_dq_odd(b, s));
  }
};
template <> struct pgk_dq_out<__half> {
  static PGK_DEVICE void put(__half* o, float a, float b, float s) {
    *reinterpret_cast<__half2*>(o) = __floats2half2_rn(pgk_dq_odd(a, s), pgk_dq_odd(b, s));
  }
};

PGK_DEVICE pgk_t pgk_dq_one(float q, float s) {
  if constexpr (sizeof(pgk_t) == 4) {
    return pgk_from_float<pgk_t>(q * s);
  } else {
    return pgk_from_float<pgk_t>(pgk_dq_odd(q, s));
  }
}

// One vector of W: PGK_DQB bytes as 32-bit words.
struct pgk_dq_vec {
  unsigned w[PGK_DQB / 4];
};

PGK_DEVICE pgk_dq_vec pgk_dq_load(const unsigned char* __restrict__ p) {
  pgk_dq_vec v;
#if PGK_DQB == 8
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  v.w[0] = u.x;
  v.w[1] = u.y;
#else
  v.w[0] = __ldg(reinterpret_cast<const unsigned*>(p));
#endif
  return v;
}

// The vector's elements, each the integer or e4m3 value exactly (int4: minus its zero).
PGK_DEVICE void pgk_dq_values(const pgk_dq_vec& v, unsigned z, float (&q)[PGK_DQE]) {
#pragma unroll
  for (int i = 0; i < PGK_DQB / 4; ++i) {
#if PGK_QFMT == 2
    const float zm = pgk_dq_magic(z);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[8 * i + j] = pgk_dq_int4(v.w[i], j, zm);
#elif PGK_QFMT == 1
    (void)z;
#pragma unroll
    for (int j = 0; j < 4; ++j) q[4 * i + j] = pgk_dq_e4m3(v.w[i], j);
#else
    (void)z;
    const unsigned x = v.w[i] ^ 0x80808080u;
#pragma unroll
    for (int j = 0; j < 4; ++j) q[4 * i + j] = pgk_dq_int8(x, j);
#endif
  }
}

// Stores n bytes (a multiple of 4, at most 16 at a time, aligned to min(n, 16)) from src.
template <int N> PGK_DEVICE void pgk_dq_store(void* dst, const void* src) {
  if constexpr (N >= 16) {
#pragma unroll
    for (int i = 0; i < N / 16; ++i)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
  } else {
    *reinterpret_cast<unsigned*>(dst) = *reinterpret_cast<const unsigned*>(src);
  }
}

// The weight [N, K] in PGK_T: K % PGK_DQE == 0, PGK_DQE divides the group (PGK_QSK), rows
// of W and of out aligned to their vector width; n * (K / PGK_DQE) < 2^31. Vector i is
// row i / per_row: (i * row_magic) >> (31 + row_shift) (dequant.py's row_divider), one
// wide multiply instead of an integer division; the next vectors of a thread step the
// row and column on from the first.
#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_dequant)
extern "C" __global__ void __launch_bounds__(256, PGK_DQMINB)
    pgk_dequant(const unsigned char* __restrict__ w, const float* __restrict__ scale,
                const unsigned char* __restrict__ zero, pgk_t* __restrict__ out, int n, int k,
                long long w_stride, int scale_ld, unsigned row_magic, int row_shift) {
  // out may be memory the kernel ahead still reads (scratch): wait before anything.
  pgk_pdl_wait();
  pgk_pdl_trigger();
  const int per_row = k / PGK_DQE;
  const unsigned total = (unsigned)n * (unsigned)per_row;
  const unsigned first = (unsigned)blockIdx.x * (blockDim.x * PGK_DQU) + threadIdx.x;
  int row = (int)(((unsigned long long)first * row_magic) >> (31 + row_shift));
  int cv = (int)first - row * per_row;  // the vector's index within its row
  // A block-width step (blockDim.x vectors) as whole rows and the rest.
  const int step_rows = (int)(((unsigned long long)blockDim.x * row_magic) >> (31 + row_shift));
  const int step_cols = (int)blockDim.x - step_rows * per_row;
  pgk_dq_vec v[PGK_DQU];
  float sc[PGK_DQU];
  unsigned zp[PGK_DQU];
  int rows[PGK_DQU], cols[PGK_DQU];
#pragma unroll
  for (int u = 0; u < PGK_DQU; ++u) {
    if (u) {
      cv += step_cols;
      row += step_rows;
      if (cv >= per_row) {
        cv -= per_row;
        ++row;
      }
    }
    rows[u] = row;
    cols[u] = cv * PGK_DQE;
    zp[u] = 8u;
    if (first + u * blockDim.x < total) {
      v[u] = pgk_dq_load(w + (long long)rows[u] * w_stride +
                         (PGK_QFMT == 2 ? cols[u] / 2 : cols[u]));
      sc[u] = pgk_dq_scale(scale, rows[u], cols[u], scale_ld);
#if PGK_QZERO
      zp[u] = zero[(long long)rows[u] * scale_ld + cols[u] / PGK_QGROUP];
#endif
    }
  }
  (void)zero;
#pragma unroll
  for (int u = 0; u < PGK_DQU; ++u) {
    if (first + u * blockDim.x >= total) break;
    const int row = rows[u], col = cols[u];
    float q[PGK_DQE];
    pgk_dq_values(v[u], zp[u], q);
    alignas(16) pgk_t o[PGK_DQE];
#pragma unroll
    for (int e = 0; e < PGK_DQE; e += 2) pgk_dq_out<pgk_t>::put(o + e, q[e], q[e + 1], sc[u]);
    pgk_dq_store<PGK_DQE * (int)sizeof(pgk_t)>(out + (long long)row * k + col, o);
  }
}
#endif

// Any K and group: one element a thread, the same values.
#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_dequant_each)
extern "C" __global__ void __launch_bounds__(256)
    pgk_dequant_each(const unsigned char* __restrict__ w, const float* __restrict__ scale,
                     const unsigned char* __restrict__ zero, pgk_t* __restrict__ out, int n,
                     int k, long long w_stride, int scale_ld) {
  pgk_pdl_wait();
  pgk_pdl_trigger();
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)n * k) return;
  const int row = (int)(i / k), col = (int)(i % k);
  const float s = pgk_dq_scale(scale, row, col, scale_ld);
  float q;
#if PGK_QFMT == 2
  const unsigned byte = w[(long long)row * w_stride + col / 2];
  const unsigned z = PGK_QZERO ? zero[(long long)row * scale_ld + col / PGK_QGROUP] : 8u;
  q = pgk_dq_int4(byte, col & 1, pgk_dq_magic(z));
#elif PGK_QFMT == 1
  (void)zero;
  q = pgk_dq_e4m3(w[(long long)row * w_stride + col], 0);
#else
  (void)zero;
  q = pgk_dq_int8(w[(long long)row * w_stride + col] ^ 0x80u, 0);
#endif
  out[i] = pgk_dq_one(q, s);
}
#endif
