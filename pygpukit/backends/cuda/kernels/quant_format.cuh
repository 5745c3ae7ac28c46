// The quantized weight layout's defines, shared by the families that read it (gemv_quant:
// the decode GEMV; dequant: the prefill's dequantization; gemm_skinny: int8 W for batched
// decode); ir/quant.py owns the layouts:
//   PGK_QFMT 0 int8 [N, K] (scale per row), 1 fp8 e4m3 [N, K] (scale per tensor, per row or
//   per 128 x 128 block), 2 int4 [N, K/2] (low nibble first; scale and, PGK_QZERO, uint8
//   zero point per group of PGK_QGROUP along K; symmetric: zero 8).
// A header, not a family: it declares no kernel (pgk_qint8_pairs, the int8 decoding, is
// shared by the GEMV and the skinny GEMM).
#pragma once
#include "common.cuh"

#ifndef PGK_QFMT
#define PGK_QFMT 0
#endif
#ifndef PGK_QSK
#define PGK_QSK 0  // 1: the scale varies along K (fp8 blocks, int4 groups)
#endif
#ifndef PGK_QTENSOR
#define PGK_QTENSOR 0  // fp8 with one scale for the whole tensor
#endif
#ifndef PGK_QGROUP
#define PGK_QGROUP 128  // K elements per scale when PGK_QSK (fp8: the block size)
#endif
#ifndef PGK_QZERO
#define PGK_QZERO 0
#endif

// Dequantizing W never touches the conversion pipe (F2F / I2F / F2FP: 16 lanes a clock
// per SM on sm_90, against 64 for shifts, LOP3 and PRMT and 128 for FP32 adds): with bf16
// x each pair of int8 weights through f16 -> f32 -> bf16 cost 1.5 conversions a weight,
// which capped the GEMV at about 10.7 weights per clock per SM (the ~60% of copy bandwidth
// int8 measured on an H200). Every value below is built exactly with integer and
// floating-point arithmetic instead.

// Bytes (0, 1) and (2, 3) of an int8 word as two f16 pairs (low byte low): b + 128 under
// the f16 exponent of 1024 is 1024 + b + 128 exactly; minus 1152 is b. Two PRMT and two
// HSUB2 a word, against the bf16 form's six PRMT and four FADD.
PGK_DEVICE void pgk_qint8_pairs_f16(unsigned w, unsigned& lo, unsigned& hi) {
  const unsigned u = w ^ 0x80808080u;  // each byte b + 128
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
  const unsigned l = __byte_perm(u, 0x64646464u, 0x4140);
  const unsigned h = __byte_perm(u, 0x64646464u, 0x4342);
  const __half2 vl = __hsub2(*reinterpret_cast<const __half2*>(&l), bias);
  const __half2 vh = __hsub2(*reinterpret_cast<const __half2*>(&h), bias);
  lo = *reinterpret_cast<const unsigned*>(&vl);
  hi = *reinterpret_cast<const unsigned*>(&vh);
}

// Bytes (0, 1) and (2, 3) of an int8 word as two pairs of x's type (low byte low).
PGK_DEVICE void pgk_qint8_pairs(unsigned w, unsigned& lo, unsigned& hi) {
  if constexpr (pgk_same<pgk_t, __nv_bfloat16>::value) {
    const unsigned u = w ^ 0x80808080u;  // each byte b + 128
    // b + 128 as the low byte of the fp32 2^23 + b + 128: minus 2^23 + 128 is b exactly,
    // and b (8 significant bits at most) is exact in the fp32's upper half, a bf16.
    unsigned f[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      f[j] = __float_as_uint(__uint_as_float(__byte_perm(u, 0x4B000000u, 0x7650 + j)) - 8388736.0f);
    lo = __byte_perm(f[0], f[1], 0x7632);
    hi = __byte_perm(f[2], f[3], 0x7632);
  } else {
    pgk_qint8_pairs_f16(w, lo, hi);
  }
}
