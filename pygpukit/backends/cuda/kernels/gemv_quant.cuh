// Weight-only quantized GEMV for decode: y[m, n] = act(sum_k x[m, k] * W[n, k] + bias[n])
// (+ residual), for up to 8 * PGK_QMX rows m of bf16/f16 x, with W in one of ir/quant.py's
// layouts:
//   PGK_QFMT 0 int8 [N, K] (scale per row), 1 fp8 e4m3 [N, K] (scale per tensor, per row or
//   per 128 x 128 block), 2 int4 [N, K/2] (low nibble first; scale and, PGK_QZERO, uint8
//   zero point per group of PGK_QGROUP along K; symmetric: zero 8).
//
// The tensor-core GEMV of gemv.cuh (its helpers are reused) with W dequantized in
// registers: each lane loads PGK_QLW 32-bit words of a row of W per chunk (16 or 8 bytes)
// and turns them into exact bf16/f16 values (the integers, the e4m3 values; no scale
// applied: a scale rounded to 2-byte precision would cost 1e-3 of accuracy) with integer
// and FP32 arithmetic only (no conversion instructions; see pgk_qint8_pairs). W is
// mma.sync m16n8k16's A operand (two n8 tiles of rows, 256 weights an MMA) and x its B
// operand (n = the rows of x). Each lane's elements are consecutive in memory, and x is
// read in the same permutation of K, so the dot products are unchanged (see gemv.cuh).
// Scales apply in fp32: per row in the epilogue; per group or block (PGK_QSK) to each
// chunk's partial sums, a chunk never spanning two groups (host: chunk width divides the
// group).
//
// Early loads and the persistent grid as in gemv.cuh: with w_early (read-only weights in
// a captured graph) the first slab of W, its scales and zero points are loaded before the
// predecessor wait, and a grid narrower than the tile count walks the tiles. Each warp
// walks its stages (slabs of its K range, tile after tile) with the next stage's loads in
// flight while it multiplies the current one (PGK_QPIPE), and each chunk accumulates on
// its own: H200, single-buffered with one MMA chain per slab, int4 [22016 x 4096] read
// 1.08 TB/s and int8 as long (load latency, then MMA latency, per slab). The RMSNorm
// prologue, bias, activation, SwiGLU epilogue and residual are gemv.cuh's.
#ifndef PGK_VEC
#define PGK_VEC 8  // gemv.cuh's scalar kernel, compiled alongside
#endif
#include "gemv.cuh"
#include "quant_format.cuh"
#ifndef PGK_QPIPE
#define PGK_QPIPE 1  // 1: the next slab of W is loaded before the current one is multiplied
#endif
#ifndef PGK_QLW
#define PGK_QLW 4  // 32-bit words of W per lane per chunk: 4 (16 bytes) or 2 (int4 group 64)
#endif
#ifndef PGK_QSTAGES
#define PGK_QSTAGES 0  // > 0: W through shared memory in this many stages per warp
#endif
#ifndef PGK_QEPRE
#define PGK_QEPRE 0  // 1: the epilogue's scale, bias and residual loaded as a tile starts
#endif
#ifndef PGK_QGB
#define PGK_QGB 4  // 16-byte pieces of the RMSNorm gain a lane loads at once (staged path)
#endif
#ifndef PGK_QBIAS
#define PGK_QBIAS 0  // 1: staged int4 under bf16 x multiplies the biased codes (see below)
#endif
#ifndef PGK_QREDB
#define PGK_QREDB (PGK_QSTAGES > 0 ? 2 : 1)  // buffers of the warps' partial sums (see epilogue)
#endif
#if PGK_QREDB == 2 && PGK_QSTAGES == 0
#error "two partial-sum buffers are the staged kernel's: the register path rewrites sumsq a tile"
#endif
#ifndef PGK_QF16
#define PGK_QF16 0  // 1: the staged kernel under bf16 x multiplies in f16 (see pgk_qmma)
#endif
#if PGK_QF16 && (PGK_QSTAGES == 0 || PGK_QBIAS)
#error "PGK_QF16 is the staged kernel's, without biased int4 codes"
#endif
#ifndef PGK_QB8
#define PGK_QB8 0  // 1: int8 under PGK_QF16 multiplies the biased bytes 1152 + q (see pgk_qfrag)
#endif
#ifndef PGK_QMX
#define PGK_QMX 1  // n8 tiles of x's rows an MMA of W's fragments feeds: 8 rows or 16
#endif
#if PGK_QMX != 1 && (PGK_QMX != 2 || PGK_QSTAGES == 0 || PGK_QF16)
#error "16 rows of x (PGK_QMX 2) are the staged kernel's, under bf16 products"
#endif
#if PGK_QB8 && !(PGK_QF16 && PGK_QFMT == 0)
#error "PGK_QB8 is int8's under f16 products"
#endif

// Elements of W per word and per lane per chunk; a chunk is 4 lanes' worth of one row.
#define PGK_QEPW (PGK_QFMT == 2 ? 8 : 4)
#define PGK_QEPL (PGK_QEPW * PGK_QLW)
#define PGK_QCW (4 * PGK_QEPL)

using pgk_qpair =
    typename pgk_gpick<pgk_same<pgk_t, __nv_bfloat16>::value, __nv_bfloat162, __half2>::type;
// W's pairs are f16 (under f16 x, or f16 products under bf16 x).
constexpr bool pgk_qhalf = PGK_QF16 || pgk_same<pgk_t, __half>::value;

PGK_DEVICE unsigned pgk_qbits(pgk_qpair p) { return *reinterpret_cast<unsigned*>(&p); }
PGK_DEVICE pgk_qpair pgk_qof(unsigned u) { return *reinterpret_cast<pgk_qpair*>(&u); }

// Bytes 2j, 2j + 1 of an fp8 e4m3 word (j = 0, 1) in the upper byte of each half, their
// exponent and mantissa (7 bits) shifted right into a 16-bit float's field: the sign is in
// place and the bits are the value / 2^120 as a bf16 (shift 4) or / 2^8 as an f16 (shift
// 1), subnormals included (exponent 0 is a subnormal there too). (NaN, 0x7F, is not a
// weight.)
PGK_DEVICE unsigned pgk_qfp8_field(unsigned w, int j, int shift) {
  const unsigned u = __byte_perm(w, 0u, j ? 0x3424 : 0x1404);
  return (u & 0x80008000u) | ((u >> shift) & ((0x7F00u >> shift) * 0x10001u));
}

// The bf16 pair of bytes 2j, 2j + 1: the field times 2^120 (exact).
PGK_DEVICE unsigned pgk_qfp8_pair_bf16(unsigned w, int j) {
  const unsigned v = pgk_qfp8_field(w, j, 4);
  const __nv_bfloat162 p =
      __halves2bfloat162(__ushort_as_bfloat16(0x7B80), __ushort_as_bfloat16(0x7B80));
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v), p);
  return *reinterpret_cast<const unsigned*>(&r);
}

// Bytes (0, 1) and (2, 3) of an fp8 e4m3 word as two f16 pairs (low byte low), exactly
// (every e4m3 value, subnormals included, is an f16 one): SM 8.9 and later convert a pair
// in one instruction; before, the f16 field times 2^8 (exact).
PGK_DEVICE void pgk_qfp8_pairs_f16(unsigned w, unsigned& lo, unsigned& hi) {
#if __CUDA_ARCH__ >= 890
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  const __half2 p = __halves2half2(__ushort_as_half(0x5C00), __ushort_as_half(0x5C00));
  unsigned pr[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const unsigned v = pgk_qfp8_field(w, j, 1);
    const __half2 h = __hmul2(*reinterpret_cast<const __half2*>(&v), p);
    pr[j] = *reinterpret_cast<const unsigned*>(&h);
  }
  lo = pr[0];
  hi = pr[1];
#endif
}

// PGK_QBIAS (the staged int4 kernel under bf16 x; gemv_quant.biased_codes says where):
// x is permuted once in shared memory (each 8 elements as 0, 4, 1, 5, 2, 6, 3, 7: the
// order pgk_qfrag pairs a word's nibbles), so a step's B fragment is two of its words, not
// two byte permutes a step and tile pair; and the biased codes 128 + q (the nibble under
// the magic exponent, exact in bf16) are multiplied as they are, (128 + z) times the
// chunk's sum of x coming off each chunk's partial sums in fp32 (pgk_qchunk): no HSUB2 a
// pair. Under f16 the biased codes would be 1024 + q, about 225 times the |q - z| they
// carry, and the fp32 sums' rounding near 1e-3 of the result.
#if PGK_QBIAS && PGK_QFMT == 2 && PGK_QSTAGES > 0
#define PGK_QBIASED 1
#else
#define PGK_QBIASED 0
#endif
// x permuted once in shared memory into pgk_qfrag's int4 pair order: the biased codes'
// pass (xprep_once) or the f16 conversion's (f16_once).
#if PGK_QBIASED || (PGK_QF16 && PGK_QFMT == 2)
#define PGK_QXPERM 1
#else
#define PGK_QXPERM 0
#endif

// Nibbles i and i + 4 of w minus the zero point, i = 0 .. 3: q - z exactly. bf16 pairs:
// the nibble set under the magic exponent of 128 (128 + q) less 128 + z, a shift for each
// i > 0. f16 pairs (pgk_qhalf): odd i take the nibble where it lies, under f16's magic of
// 1024 (1024 + 16 q), and one HFMA2 makes (1024 + 16 q) / 16 - (64 + z), exact; even i
// the nibble under the magic less 1024 + z: a word's four pairs take one shift (w >> 8),
// not three. PGK_QBIASED: 128 + q itself.
PGK_DEVICE unsigned pgk_qint4_pair(unsigned w, int i, unsigned zpair, unsigned magic) {
#if PGK_QBIASED
  static_assert(pgk_same<pgk_t, __nv_bfloat16>::value, "biased int4 codes need bf16 x");
  (void)zpair;
  return ((w >> (4 * i)) & 0x000F000Fu) | magic;
#else
  if constexpr (pgk_qhalf) {
    const unsigned v = i >= 2 ? w >> 8 : w;
    if (i & 1) {
      const unsigned q = (v & 0x00F000F0u) | magic;
      // -(64 + z): f16 64 is 0x5400, its last place 1/16, so z sits four bits up.
      const unsigned nz = ((zpair & 0x000F000Fu) << 4) | 0xD400D400u;
      const __half2 r = __hfma2(*reinterpret_cast<const __half2*>(&q),
                                __halves2half2(__ushort_as_half(0x2C00), __ushort_as_half(0x2C00)),
                                *reinterpret_cast<const __half2*>(&nz));
      return *reinterpret_cast<const unsigned*>(&r);
    }
    const unsigned q = (v & 0x000F000Fu) | magic;
    const __half2 r =
        __hsub2(*reinterpret_cast<const __half2*>(&q), *reinterpret_cast<const __half2*>(&zpair));
    return *reinterpret_cast<const unsigned*>(&r);
  } else {
    const unsigned q = ((w >> (4 * i)) & 0x000F000Fu) | magic;
    return pgk_qbits(__hsub2(pgk_qof(q), pgk_qof(zpair)));
  }
#endif
}

// The int4 magic pair held in a register: the mask and the magic of pgk_qint4_pair are two
// constants and LOP3 takes one immediate; with both known ptxas rematerialized the other
// before every use (a move for each pair of weights). n >= 0, so n >> 31 is 0, but only
// at run time.
PGK_DEVICE unsigned pgk_qmagic(int n) {
  constexpr unsigned magic = pgk_qhalf ? 0x64006400u : 0x43004300u;
  return magic | (unsigned)(n >> 31);
}

PGK_DEVICE unsigned pgk_qzero_pair(int z) {
  const unsigned magic = pgk_qhalf ? 0x6400u : 0x4300u;
  const unsigned h = magic | (unsigned)z;
  return h | (h << 16);
}

// PGK_QF16 (the staged kernel under bf16 x; gemv_quant.half_mma says where): int8 weights
// become f16 pairs in two PRMT and two HSUB2 a word (pgk_qint8_pairs_f16) where bf16 pairs
// take six PRMT and four FADD, e4m3 pairs in one conversion each (pgk_qfp8_pairs_f16) where
// bf16 pairs take four instructions, int4 words in one shift where bf16 pairs take three
// (pgk_qint4_pair, x permuted on the way: no PRMT a step), and the MMA multiplies f16. x is
// turned into f16 once in shared memory, each row of a warp's columns times the power of two 2^-s
// that brings its largest magnitude to [2^14, 2^15): every bf16 value down to 2^-31 of that largest
// is then exact in f16 (its subnormals hold 8 significant bits down to 2^-17), the rest rounded to
// 2^-24; the warp's partial sums are multiplied by 2^s before they meet. Products and fp32
// accumulation are those of the bf16 MMA.
PGK_DEVICE void pgk_qmma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                         unsigned b1) {
#if PGK_QF16
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  pgk_gmma(d, a0, a1, a2, a3, b0, b1);
#endif
}

// Step s's pairs of this lane's row of W (4 elements of its chunk): lo at k 2qc, 2qc + 1
// and hi at 2qc + 8, 2qc + 9 of the MMA's K, from the row's words.
PGK_DEVICE void pgk_qfrag(const unsigned (&wv)[PGK_QLW], int s, unsigned zpair, unsigned magic,
                          unsigned& lo, unsigned& hi) {
#if PGK_QFMT == 2
  // Word s / 2 holds elements 8j .. 8j + 7; step 2j takes pairs (0,4), (1,5), 2j+1 (2,6), (3,7).
  const int i = (s & 1) * 2;
  lo = pgk_qint4_pair(wv[s >> 1], i, zpair, magic);
  hi = pgk_qint4_pair(wv[s >> 1], i + 1, zpair, magic);
#else
  (void)zpair;
  (void)magic;
  // f16 pairs under f16 products or f16 x (pgk_qhalf); bf16 pairs otherwise.
  if constexpr (PGK_QFMT == 1 && pgk_qhalf) {
    pgk_qfp8_pairs_f16(wv[s], lo, hi);
  } else if constexpr (PGK_QFMT == 1) {
    lo = pgk_qfp8_pair_bf16(wv[s], 0);
    hi = pgk_qfp8_pair_bf16(wv[s], 1);
  } else if constexpr (PGK_QB8) {
    // The biased bytes: 128 + q under f16's exponent of 1024 is 1152 + q exactly, left
    // biased (two PRMT a word, no HSUB2); 1152 times the warp's sums of x come off its
    // partial sums in fp32 after the tile (see f16_once).
    const unsigned u = wv[s] ^ 0x80808080u;
    lo = __byte_perm(u, 0x64646464u, 0x4140);
    hi = __byte_perm(u, 0x64646464u, 0x4342);
  } else if constexpr (pgk_qhalf) {
    pgk_qint8_pairs_f16(wv[s], lo, hi);
  } else {
    pgk_qint8_pairs(wv[s], lo, hi);
  }
#endif
}

// 8 elements of x (16-bit, one uint4) in the order pgk_qfrag pairs an int4 word's
// nibbles: 0, 4, 1, 5, 2, 6, 3, 7.
PGK_DEVICE uint4 pgk_qx_pairs(uint4 v) {
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                    __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
}

// The B fragment's x pairs of step s from this lane's x (8 elements per uint4), in the
// order pgk_qfrag pairs W's elements (int4 without PGK_QXPERM: permuted here, the two
// pairs step s takes).
PGK_DEVICE void pgk_qxfrag(const uint4* xv, int s, unsigned& b0, unsigned& b1) {
  const uint4 v = PGK_QFMT == 2 && !PGK_QXPERM ? pgk_qx_pairs(xv[s >> 1]) : xv[s >> 1];
  b0 = (s & 1) ? v.z : v.x;
  b1 = (s & 1) ? v.w : v.y;
}

// One chunk (U of them per slab) against the NT n8 tiles: x's fragments xv (the lane's
// EPL elements), W's words of tile t from wget(t, words), its zero-point pair from
// zget(t) and, with PGK_QSK, the scale of the lane's row of tile t from sget(t).
// W is the MMA's A operand: tiles t and t + 1 are its rows 0-7 and 8-15 (m16 x k16, 256
// weights an MMA), x the B operand (k16 x n8, its columns the rows of x). With W as B
// (n8 x k16, x in A's rows 0-7, rows 8-15 zero) every weight cost twice the tensor work
// and the zero rows a register move each. C's rows are then W's rows: acc[h][t][e] is the
// lane's row qr of tile t against x's row 8h + 2qc + e: with MX = 2 two n8 tiles of x's rows
// (xv[h], the lane's elements of row 8h + qr) take the same A fragments, W dequantized once.
// (A function template, not a generic lambda: see pgk_gmma_slab.)
// With PGK_QBIASED, xs[h][e] is the chunk's sum of x's row 8h + 2qc + e (0 past m and K).
template <int MX, int NT, typename WGet, typename ZGet, typename SGet>
PGK_DEVICE void pgk_qchunk(float (&acc)[MX][NT][2], const uint4 (&xv)[MX][PGK_QEPL / 8], WGet wget,
                           ZGet zget, SGet sget, unsigned magic, const float (&xs)[MX][2]) {
  (void)xs;
#pragma unroll
  for (int t = 0; t < NT; t += 2) {
    const bool pair = t + 1 < NT;  // an odd NT's last tile leaves A's rows 8-15 zero
    unsigned w0[PGK_QLW], w1[PGK_QLW];
    wget(t, w0);
    if (pair) wget(t + 1, w1);
    const unsigned z0 = zget(t), z1 = pair ? zget(t + 1) : 0u;
    // A chunk's own accumulator: the chunks' MMA chains are independent (one chain
    // through the whole slab serialized the tensor-core latency).
    float part[MX][4];
#pragma unroll
    for (int h = 0; h < MX; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[h][e] = 0.0f;
#pragma unroll
    for (int s = 0; s < PGK_QEPL / 4; ++s) {
      unsigned a0, a1 = 0u, a2, a3 = 0u;
      pgk_qfrag(w0, s, z0, magic, a0, a2);
      if (pair) pgk_qfrag(w1, s, z1, magic, a1, a3);
#pragma unroll
      for (int h = 0; h < MX; ++h) {
        unsigned b0, b1;
        pgk_qxfrag(xv[h], s, b0, b1);
        pgk_qmma(part[h], a0, a1, a2, a3, b0, b1);
      }
    }
#pragma unroll
    for (int h = 0; h < MX; ++h) {
#if PGK_QBIASED
      // The biased codes' partial sums less (128 + z) times the sums of x: the low half of
      // the zero-point pair is the bf16 128 + z, its bits shifted up the float.
      const float zc0 = __uint_as_float(z0 << 16), zc1 = __uint_as_float(z1 << 16);
      part[h][0] = fmaf(-zc0, xs[h][0], part[h][0]);
      part[h][1] = fmaf(-zc0, xs[h][1], part[h][1]);
      part[h][2] = fmaf(-zc1, xs[h][0], part[h][2]);
      part[h][3] = fmaf(-zc1, xs[h][1], part[h][3]);
#endif
#if PGK_QSK == 1
      const float s0 = sget(t);
      acc[h][t][0] += part[h][0] * s0;
      acc[h][t][1] += part[h][1] * s0;
      if (pair) {
        const float s1 = sget(t + 1);
        acc[h][t + 1][0] += part[h][2] * s1;
        acc[h][t + 1][1] += part[h][3] * s1;
      }
#else
      (void)sget;
      acc[h][t][0] += part[h][0];
      acc[h][t][1] += part[h][1];
      if (pair) {
        acc[h][t + 1][0] += part[h][2];
        acc[h][t + 1][1] += part[h][3];
      }
#endif
    }
  }
}

// 4-byte cp.async (the per-group and per-block scales of a stage); src-size 0 zero-fills.
PGK_DEVICE void pgk_qcp_async4(void* smem, const void* gmem, bool pred) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  const int n = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

// PGK_QMINB > 0: blocks an SM the registers must leave room for (gemv_quant.py min_blocks);
// absent, ptxas is given the block size only (its register choice differs from a bound of
// one block an SM).
#if defined(PGK_QMINB) && PGK_QMINB > 0
#define PGK_QBOUNDS __launch_bounds__(PGK_GW * 32, PGK_QMINB)
#else
#define PGK_QBOUNDS __launch_bounds__(PGK_GW * 32)
#endif
#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_gemv_quant)
extern "C" __global__ void PGK_QBOUNDS pgk_gemv_quant(
    const pgk_t* __restrict__ x, const unsigned char* __restrict__ w,
    const float* __restrict__ scale, const unsigned char* __restrict__ zero,
    const pgk_t* __restrict__ bias, pgk_t* __restrict__ y, int m, int n, int k, long long x_stride,
    long long w_stride, long long y_stride, int scale_ld, const pgk_t* __restrict__ res,
    const pgk_t* __restrict__ pro, long long res_stride, float eps, int w_early) {
  constexpr int U = PGK_U, NT = PGK_NT, LW = PGK_QLW, EPL = PGK_QEPL, CW = PGK_QCW;
  constexpr int XV = EPL / 8;     // uint4s of x per lane per chunk
  constexpr int RL = 8 * NT + 1;  // a row of the partial sums (padded: rows in other banks)
  constexpr int MX = PGK_QMX, MR = 8 * MX;  // n8 tiles of x's rows, and their rows
#if PGK_PRO == 1
  __shared__ float sumsq[PGK_GW][8 * PGK_QMX];
#endif
  // Dynamic shared memory: (staged) each warp's stages and the m rows of x, then the
  // warps' partial sums of the m rows, red[(warp * m + row) * RL + col] (gemv_quant.py's
  // red_bytes). Sized by m, not 8 rows: at K = 4096 that is what lets a third staged block
  // of int8 or fp8 onto an SM.
  extern __shared__ __align__(16) unsigned char pgk_qsm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int qr = lane >> 2, qc = lane & 3;
  const int tiles = PGK_GLU ? (n / 2 + 4 * NT - 1) / (4 * NT) : (n + 8 * NT - 1) / (8 * NT);
  const int my_tiles = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  const int nch = (k + CW - 1) / CW;  // chunks of CW columns, split over the warps
  const int c_lo = (int)((long long)nch * warp / PGK_GW);
  const int c_hi = (int)((long long)nch * (warp + 1) / PGK_GW);
  const bool xin = qr < m;
  const unsigned qmagic = pgk_qmagic(n);
  // Every warp has the same slab count per tile (the epilogue's barrier is per tile);
  // chunks past a warp's range read nothing.
  const int n_st = ((nch + PGK_GW - 1) / PGK_GW + U - 1) / U;
  const int total = my_tiles * n_st;
  const int first_tile = (int)blockIdx.x;

  float acc[MX][NT][2];
  float ss[4], ss_hi[4];
  // The sums of squares are the warp's columns of x, whatever the tile: the staged path
  // takes them once, the register path once per tile (zero_acc).
  auto zero_ss = [&]() {
#pragma unroll
    for (int e = 0; e < 4; ++e) ss[e] = ss_hi[e] = 0.0f;
  };
  zero_ss();
  auto zero_acc = [&]() {
#pragma unroll
    for (int h = 0; h < MX; ++h)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) acc[h][t][e] = 0.0f;
  };

  // The epilogue's operands from global memory (the row scale, bias, residual) of the
  // output (r, cn) a thread writes. Loaded as the epilogue reaches them, each tile's
  // outputs wait one memory round trip behind the block's barrier; with PGK_QEPRE (each
  // thread takes at most one output of a tile) they are loaded as the tile starts.
  constexpr int OUT = PGK_GLU ? 4 * NT : 8 * NT;
  constexpr bool EPRE = PGK_QEPRE && MR * OUT <= PGK_GW * 32;
  struct eops {
    float sc, sc_up, b, b_up, res;
  };
  auto eload = [&](int tile, int i) {
    eops e = {1.0f, 1.0f, 0.0f, 0.0f, 0.0f};
    const int r = i / OUT, cn = i % OUT;
    const int row = pgk_grow(n, cn, tile);
    if (i >= MR * OUT || r >= m || row < 0) return e;
#if PGK_QSK == 0
    e.sc = PGK_QTENSOR ? __ldg(scale) : __ldg(scale + row);
    if (PGK_GLU) e.sc_up = PGK_QTENSOR ? __ldg(scale) : __ldg(scale + n / 2 + row);
#endif
    if (bias) {
      e.b = pgk_to_float(bias[row]);
      if (PGK_GLU) e.b_up = pgk_to_float(bias[n / 2 + row]);
    }
    if (res) e.res = pgk_to_float(res[(long long)r * res_stride + row]);
    return e;
  };
  eops epre = {1.0f, 1.0f, 0.0f, 0.0f, 0.0f};
  // The thread of a tile's outputs: with two partial-sum buffers the block's tiles rotate
  // the outputs over its warps (rot, the tile's index in the block), so no warp is the one
  // that reduces every tile while the others go on to the next.
  auto out_thread = [&](int rot) {
    return PGK_QREDB == 2 ? ((int)threadIdx.x + 32 * (rot % PGK_GW)) % (PGK_GW * 32)
                          : (int)threadIdx.x;
  };
  auto eprefetch = [&](int tile, int rot) {
    if constexpr (EPRE) epre = eload(tile, out_thread(rot));
  };

  // The warps' partial sums meet in shared memory; the block writes the tile's outputs.
  // With PGK_QREDB 2 a tile writes the buffer the tile before last read, so the barrier after
  // the reads goes: a thread reaches this tile's writes only past the last tile's barrier,
  // which every thread passes only after its reads of the tile before.
  auto epilogue = [&](int tile, float* red, int rot) {
#pragma unroll
    for (int h = 0; h < MX; ++h)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = 8 * h + 2 * qc + e;
          if (r < m) red[(warp * m + r) * RL + t * 8 + qr] = acc[h][t][e];
        }
#if PGK_PRO == 1 && PGK_QSTAGES == 0
    if (qc == (qr >> 1)) sumsq[warp][qr] = (qr & 1) ? ss[1] : ss[0];
#endif
    __syncthreads();
    for (int i = out_thread(rot); i < MR * OUT; i += PGK_GW * 32) {
      const int r = i / OUT, cn = i % OUT;
      const int row = pgk_grow(n, cn, tile);
      if (r >= m || row < 0) continue;
      eops e = epre;
      if constexpr (!EPRE) e = eload(tile, i);
      float rs = 1.0f;
#if PGK_PRO == 1
      float q = 0.0f;
#pragma unroll
      for (int g = 0; g < PGK_GW; ++g) q += sumsq[g][r];
      rs = rsqrtf(q / (float)k + eps);
#endif
      float s = 0.0f;
#pragma unroll
      for (int g = 0; g < PGK_GW; ++g) s += red[(g * m + r) * RL + cn];
      s = s * rs * e.sc + e.b;
#if PGK_GLU == 1
      float up = 0.0f;
#pragma unroll
      for (int g = 0; g < PGK_GW; ++g) up += red[(g * m + r) * RL + cn + OUT];
      up = up * rs * e.sc_up + e.b_up;
      s = s / (1.0f + __expf(-s)) * up;
#else
      s = pgk_epilogue_act(s);
#endif
      if (res) s += e.res;
      y[(long long)r * y_stride + row] = pgk_from_float<pgk_t>(s);
    }
    if (PGK_QREDB == 1) __syncthreads();  // red is rewritten by the next tile
  };

#if PGK_QSTAGES > 0
  // W through shared memory in PGK_QSTAGES stages per warp (cp.async, 16 bytes a lane per
  // chunk, whole 64-byte runs of a row): the next stages' bytes stay in flight while the
  // current one is dequantized and multiplied, and every load of a stage is issued at one
  // point. A stage is U chunks of 8 * NT rows (odd rows' 64-byte halves swapped,
  // pgk_gswz, so the fragment reads of rows qr and qr + 1 land in distinct banks), with
  // PGK_QSK the rows' scales of each chunk (4-byte cp.async) and with PGK_QZERO each
  // lane's own zero points (plain loads, stored to shared memory one step later, when
  // they have arrived with the stage's other bytes). The warp's range of x (m rows) is
  // loaded once into shared memory after the wait; with the RMSNorm prologue the warp
  // turns it into x * gain there once, with the sums of squares, when it has arrived
  // (per chunk of every tile, the prologue's MMAs and multiplies doubled the tensor work
  // of int8 and made [12288 x 4096] 25% slower than without it, int4 37%, on an H200).
  // With w_early the first stages load before the predecessor wait (read-only weights in
  // a captured graph); the stage sequence runs on across the block's tiles.
  static_assert(LW == 4, "staged chunks are 16 bytes a lane");
  constexpr int NS = PGK_QSTAGES, SROWS = 8 * NT;
  constexpr int CPR = 4 * U;      // 16-byte pieces per slab row (4 lanes per chunk)
  constexpr int SLDB = 16 * CPR;  // bytes of a slab row
  static_assert(SLDB % 128 == 0, "a slab row spans whole 128-byte lines (U >= 2)");
  constexpr int WST = SROWS * SLDB;                 // W bytes of a stage
  constexpr int SST = PGK_QSK ? 4 * SROWS * U : 0;  // scale bytes of a stage
  constexpr int ZST = PGK_QZERO ? 32 * NT * U : 0;  // zero-point bytes of a stage
  constexpr int STB = (WST + SST + ZST + 15) / 16 * 16;
  unsigned char* wsm = pgk_qsm + warp * (NS * STB);
  const int xld = nch * CW + 8;  // x rows: all of K, padded (rows in other banks)
  pgk_t* xsm = reinterpret_cast<pgk_t*>(pgk_qsm + PGK_GW * NS * STB);
  float* red = reinterpret_cast<float*>(xsm + m * xld);
  // PGK_QBIASED: the sums of x per chunk of each warp's range and row, after the partial
  // sums (gemv_quant.py's xsum_bytes): xsum[(warp * cpw + chunk) * m + row].
  const int cpw = (nch + PGK_GW - 1) / PGK_GW;
  float* xsum = red + (PGK_QREDB * PGK_GW * m * RL + 3) / 4 * 4 + warp * cpw * m;
  (void)xsum;
  unsigned zpend[NT][U];  // zero points loaded for stage zslot, not yet in shared memory
  int zslot = -1;
  (void)zpend;
  auto zflush = [&]() {
#if PGK_QZERO == 1
    if (zslot >= 0) {
      unsigned char* zs = wsm + zslot * STB + WST + SST + lane * NT * U;
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int u = 0; u < U; ++u) zs[t * U + u] = (unsigned char)zpend[t][u];
    }
#endif
    zslot = -1;
  };
  // Stages are issued in order (0, 1, 2, ...): stage is_j of tile is_tile is next. A
  // lane's pieces of a stage are one column of rows i * RSTEP + lrow (CPR divides 32), so
  // the row pointers are set once a tile, and a stage adds its column: the per-stage
  // address arithmetic of every piece had been about a third of the loop's instructions.
  constexpr int RSTEP = 32 / CPR;
  static_assert(32 % CPR == 0, "a stage row is at most 32 pieces (U <= 8)");
  const int lrow = lane / CPR, lpc = lane % CPR;
  const int lcol = (lpc / 4) * CW + (lpc % 4) * EPL;  // the lane's column in a stage
  int is_j = 0, is_tile = first_tile;
  const unsigned char* wrow[NT * U];  // the tile's rows, nullptr past N
  auto issue = [&](int st) {
    const int tile = is_tile;
    const int c0 = c_lo + is_j * U;
    if (is_j == 0) {
#pragma unroll
      for (int i = 0; i < NT * U; ++i) {
        const int row = pgk_grow(n, i * RSTEP + lrow, tile);
        wrow[i] = row >= 0 ? w + (long long)row * w_stride : nullptr;
      }
    }
    if (++is_j == n_st) {
      is_j = 0;
      is_tile += (int)gridDim.x;
    }
    unsigned char* base = wsm + (st % NS) * STB;
    const int col = c0 * CW + lcol;
    const bool cin = c0 + lpc / 4 < c_hi && col < k;
    const int byte = PGK_QFMT == 2 ? col / 2 : col;  // int4: two a byte
#pragma unroll
    for (int i = 0; i < NT * U; ++i) {
      const int r = i * RSTEP + lrow;
      const bool in = cin && wrow[i] != nullptr;
      pgk_cp_async16(base + r * SLDB + pgk_gswz(r, lpc) * 16, in ? wrow[i] + byte : w, in);
    }
#if PGK_QSK == 1
    float* scs = reinterpret_cast<float*>(base + WST);
    for (int p = lane; p < SROWS * U; p += 32) {
      const int r = p / U, c = c0 + p % U;
      const int row = pgk_grow(n, r, tile), col = c * CW;
      const bool in = row >= 0 && c < c_hi && col < k;
      const int grp = col / PGK_QGROUP;
      const long long at = PGK_QFMT == 1 ? (long long)(row / PGK_QGROUP) * scale_ld + grp
                                         : (long long)row * scale_ld + grp;
      pgk_qcp_async4(scs + p, in ? scale + at : scale, in);
    }
#endif
#if PGK_QZERO == 1
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int row = pgk_grow(n, t * 8 + qr, tile);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u, col = c * CW;
        const bool in = row >= 0 && c < c_hi && col < k;
        zpend[t][u] = in ? __ldg(zero + (long long)row * scale_ld + col / PGK_QGROUP) : 8u;
      }
    }
    zslot = st % NS;
#endif
  };
  const int pre = NS - 1 < total ? NS - 1 : total;  // stages issued before the loop
  auto first_stages = [&]() {
    for (int st = 0; st < NS - 1; ++st) {
      zflush();
      if (st < pre) issue(st);
      pgk_cp_async_commit();
    }
  };
  // The RMSNorm gain of the warp's columns, GB 16-byte pieces a lane at once (all of a
  // batch's loads in flight together: one after another, each waiting for its load, added
  // about 5 us to [12288 x 4096] int8; gemv_quant.GAIN_BATCH, per format). With bit 1
  // of w_early (the gain read-only too) the first batch loads before the predecessor wait:
  // after it the gain had been one more memory round trip behind x's before the first MMA.
#if PGK_PRO == 1
  constexpr int GB = PGK_QGB;
  const int gpieces = (c_hi - c_lo) * (CW / 8), gcol0 = c_lo * CW;
  auto gain_batch = [&](int p0, uint4(&gv)[GB]) {
#pragma unroll
    for (int i = 0; i < GB; ++i) {
      const int p = p0 + 32 * i, col = gcol0 + 8 * p;
      gv[i] = pgk_gload_x(pro + col, p < gpieces && col < k);
    }
  };
  const bool g_early = (w_early & 2) != 0;  // set only beside bit 0 (gemv_quant.py)
  uint4 gpre[GB];
  if (g_early) gain_batch(lane, gpre);  // before the stages: not queued behind their loads
#endif
  if (w_early) first_stages();
  pgk_pdl_wait();
  pgk_pdl_trigger();
  (void)zero;
  {  // this warp's columns of x, as one group
    const int pieces = (c_hi - c_lo) * (CW / 8);
    for (int p = lane; p < m * pieces; p += 32) {
      const int r = p / pieces, col = c_lo * CW + (p % pieces) * 8;
      const bool in = col < k;
      pgk_cp_async16(xsm + r * xld + col, in ? x + (long long)r * x_stride + col : x, in);
    }
    pgk_cp_async_commit();
  }
  (void)pro;
  // The prologue on the warp's columns of x in shared memory, once, before the first
  // stage is multiplied: every lane takes 16-byte pieces of the columns (the gain in
  // batches, gain_batch), sums the squares of the raw values of each row in fp32 and
  // writes back x * gain as pgk_gscale rounds it; the warp's sums of squares go to sumsq
  // once (the register path takes them per tile with its MMAs).
  auto prologue_once = [&]() {
#if PGK_PRO == 1
    float sq[MR];
#pragma unroll
    for (int r = 0; r < MR; ++r) sq[r] = 0.0f;
    for (int p0 = lane; p0 < gpieces; p0 += 32 * GB) {
      uint4 gv[GB];
      if (g_early && p0 == lane) {
#pragma unroll
        for (int i = 0; i < GB; ++i) gv[i] = gpre[i];
      } else {
        gain_batch(p0, gv);
      }
#pragma unroll
      for (int i = 0; i < GB; ++i) {
        const int p = p0 + 32 * i, col = gcol0 + 8 * p;
        if (p >= gpieces) break;
#pragma unroll
        for (int r = 0; r < MR; ++r) {
          if (r >= m) break;
          uint4* at = reinterpret_cast<uint4*>(xsm + r * xld + col);
          const uint4 xv = *at;
          const pgk_t* e = reinterpret_cast<const pgk_t*>(&xv);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float f = pgk_to_float(e[j]);
            sq[r] = fmaf(f, f, sq[r]);
          }
          *at = pgk_gscale(xv, gv[i]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < MR; ++r) {
      if (r >= m) break;
      float v = sq[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) sumsq[warp][r] = v;
    }
    __syncwarp();
#endif
  };
  // Once x (and the prologue's x * gain) is in shared memory, PGK_QBIASED permutes each 8
  // elements into pgk_qfrag's pair order and sums each chunk of each row in fp32. A chunk
  // is CW / 8 consecutive pieces (16 for int4), and a warp's range a whole number of
  // chunks of each row, so the lanes of each half-warp hold one chunk of one row and
  // reduce it with shuffles.
  auto xprep_once = [&]() {
#if PGK_QBIASED
    constexpr int PPC = CW / 8;  // pieces of a chunk
    static_assert(PPC == 16, "int4 chunks are 16 pieces (a half-warp)");
    const int pieces = (c_hi - c_lo) * PPC;
    for (int p0 = 0; p0 < m * pieces; p0 += 32) {
      const int p = p0 + lane;
      const bool in = p < m * pieces;
      const int r = in ? p / pieces : 0, pc = in ? p % pieces : 0;
      float sum = 0.0f;
      if (in) {
        uint4* at = reinterpret_cast<uint4*>(xsm + r * xld + c_lo * CW + 8 * pc);
        const uint4 v = *at;
        *at = pgk_qx_pairs(v);
        const pgk_t* e = reinterpret_cast<const pgk_t*>(&v);
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          a += pgk_to_float(e[j]);
          b += pgk_to_float(e[j + 1]);
        }
        sum = a + b;
      }
#pragma unroll
      for (int o = PPC / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (in && (lane & (PPC - 1)) == 0) xsum[(pc / PPC) * m + r] = sum;
    }
    __syncwarp();
#endif
  };
  // PGK_QF16: this warp's columns of each row of x (x * gain after the prologue) as f16
  // times 2^-s (pgk_qmma), and 2^s for the lane's rows 2qc, 2qc + 1 (the C fragment's).
  // Unrolled, it keeps values live into the main loop (plain launches 102 registers, 74
  // with these loops at unroll 1), yet the unroll-1 form measured slower at the 7B plain
  // shapes (H200: [4096 x 4096] + residual 5.84 -> 6.78 us, [4096 x 11008] 13.32 -> 13.76)
  // and faster only with the RMSNorm prologue at K = 2048 (4.81 -> 4.36).
  float xunscale[2] = {1.0f, 1.0f};
  // PGK_QB8: the warp's sums of x (as f16 times 2^-s, what its MMAs multiply) of the lane's
  // rows 2qc, 2qc + 1.
  float xbsum[2] = {0.0f, 0.0f};
  (void)xbsum;
  auto f16_once = [&]() {
#if PGK_QF16
    const int pieces = (c_hi - c_lo) * (CW / 8);
    for (int r = 0; r < m; ++r) {
      float rsum = 0.0f;
      (void)rsum;
      uint4* row = reinterpret_cast<uint4*>(xsm + r * xld + c_lo * CW);
      unsigned big = 0u;  // the largest |x| as its float bits (ordered as the magnitudes)
      for (int p = lane; p < pieces; p += 32) {
        const uint4 v = row[p];
        const unsigned w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j)
          big = max(big, max((w4[j] << 16) & 0x7FFFFFFFu, w4[j] & 0x7FFF0000u));
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) big = max(big, __shfl_xor_sync(0xffffffffu, big, o));
      // Biased exponent e of the largest magnitude, brought to 2^14 (e 141): small rows
      // are scaled up too, so no value a float product would keep falls below f16's
      // normal range. NaN and infinity (e 255) keep s = 0 and stay NaN / infinity; an
      // all-zero row takes the clamp.
      const int e = (int)(big >> 23);
      const int sh = e == 255 ? 0 : min(max(e - 141, -100), 113);
      const float down = __uint_as_float((unsigned)(127 - sh) << 23);
      const float up = __uint_as_float((unsigned)(127 + sh) << 23);
      if (r == 2 * qc) xunscale[0] = up;
      if (r == 2 * qc + 1) xunscale[1] = up;
      for (int p = lane; p < pieces; p += 32) {
        const uint4 v = row[p];
        const unsigned w4[4] = {v.x, v.y, v.z, v.w};
        unsigned o4[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const __half2 h = __floats2half2_rn(__uint_as_float(w4[j] << 16) * down,
                                              __uint_as_float(w4[j] & 0xFFFF0000u) * down);
          o4[j] = *reinterpret_cast<const unsigned*>(&h);
          if (PGK_QB8) {
            const float2 f = __half22float2(h);
            rsum += f.x + f.y;
          }
        }
        const uint4 h = make_uint4(o4[0], o4[1], o4[2], o4[3]);
        row[p] = PGK_QFMT == 2 ? pgk_qx_pairs(h) : h;  // int4: its pair order (PGK_QXPERM)
      }
      if (PGK_QB8) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) rsum += __shfl_xor_sync(0xffffffffu, rsum, o);
        if (r == 2 * qc) xbsum[0] = rsum;
        if (r == 2 * qc + 1) xbsum[1] = rsum;
      }
    }
    __syncwarp();
#endif
  };
  if (!w_early) first_stages();
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
  const int sw = (qr & 1) << 2;  // pgk_gswz for this lane's rows (t * 8 + qr)
  int st = 0;
  for (int ti = 0; ti < my_tiles; ++ti) {
    zero_acc();
    for (int j = 0; j < n_st; ++j, ++st) {
      zflush();
      if (st + NS - 1 < total) issue(st + NS - 1);
      pgk_cp_async_commit();
      if (j == 0) eprefetch(first_tile + ti * (int)gridDim.x, ti);
      // Groups: x and stages 0 .. NS-2 (x last with w_early, else first), then one stage
      // per step: stage st has at most NS - 1 groups after it; with w_early the first
      // step also needs x, which has one.
      if (w_early && st == 0) {
        pgk_cp_async_wait<1>();
      } else {
        pgk_cp_async_wait<NS - 1>();
      }
      __syncwarp();
      if (st == 0) {
        prologue_once();
        xprep_once();
        f16_once();
      }
      const unsigned char* base = wsm + (st % NS) * STB;
      const float* scs = reinterpret_cast<const float*>(base + WST);
      const unsigned char* zs = base + WST + SST + lane * NT * U;
      (void)scs;
      (void)zs;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        // Past the warp's range shared memory holds no x (W there is zero-filled).
        const int c = c_lo + j * U + u, col = c * CW + qc * EPL;
        const bool cin = c < c_hi;
        uint4 xv[MX][XV];
        float xs[MX][2];
#pragma unroll
        for (int h = 0; h < MX; ++h) {
          const int xrow = 8 * h + qr;
#pragma unroll
          for (int jx = 0; jx < XV; ++jx)
            xv[h][jx] = xrow < m && cin
                            ? *reinterpret_cast<const uint4*>(xsm + xrow * xld + col + 8 * jx)
                            : zero4;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            xs[h][e] = 0.0f;
#if PGK_QBIASED
            const int r = 8 * h + 2 * qc + e;
            if (cin && r < m) xs[h][e] = xsum[(c - c_lo) * m + r];
#endif
          }
        }
        pgk_qchunk<MX, NT>(
            acc, xv,
            [&](int t, unsigned (&wv)[LW]) {
              const uint4 v = *reinterpret_cast<const uint4*>(base + (t * 8 + qr) * SLDB +
                                                              ((u * 4 + qc) ^ sw) * 16);
              wv[0] = v.x;
              wv[1] = v.y;
              wv[2] = v.z;
              wv[3] = v.w;
            },
            [&](int t) { return pgk_qzero_pair(PGK_QZERO ? (int)zs[t * U + u] : 8); },
            [&](int t) { return scs[(t * 8 + qr) * U + u]; }, qmagic, xs);
      }
      __syncwarp();  // this stage is refilled by a later step's issue
    }
#if PGK_QF16
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        acc[0][t][e] =
            (PGK_QB8 ? fmaf(-1152.0f, xbsum[e], acc[0][t][e]) : acc[0][t][e]) * xunscale[e];
#endif
    epilogue(first_tile + ti * (int)gridDim.x, red + (ti % PGK_QREDB) * (PGK_GW * m * RL), ti);
  }
  pgk_cp_async_wait<0>();
#else
  // Fragments straight from global memory into registers: the path for rows of x that do
  // not fit in shared memory beside the stages, and for 8-byte chunks (int4 groups of 64).
  // One slab: U chunks of NT tiles' rows (W row qr of each n8 tile for the B fragment;
  // with PGK_QSK the scales of rows 2qc, 2qc + 1, the C fragment's columns). Stage s of
  // this warp is slab s % n_st of its tile s / n_st.
  using wregs = unsigned[U][NT][LW];
  using sregs = float[U][NT];
  using zregs = unsigned[U][NT];
  auto load = [&](int st, wregs& wv, sregs& sc, zregs& zp) {
    const int tile = first_tile + (st / n_st) * (int)gridDim.x;
    const int c0 = c_lo + (st % n_st) * U;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u;
      const int col = c * CW + qc * EPL;
      const bool in = c < c_hi && col < k;
      const int grp = col / PGK_QGROUP;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int row = pgk_grow(n, t * 8 + qr, tile);
        const bool rin = in && row >= 0;
        const long long byte = PGK_QFMT == 2 ? col / 2 : col;  // int4: two a byte
        const unsigned char* p = w + (rin ? (long long)row * w_stride + byte : 0);
        if constexpr (LW == 4) {
          const uint4 v = rin ? __ldcs(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
          wv[u][t][0] = v.x;
          wv[u][t][1] = v.y;
          wv[u][t][2 % LW] = v.z;
          wv[u][t][3 % LW] = v.w;
        } else {
          const uint2 v = rin ? __ldcs(reinterpret_cast<const uint2*>(p)) : make_uint2(0, 0);
          wv[u][t][0] = v.x;
          wv[u][t][1] = v.y;
        }
        zp[u][t] = pgk_qzero_pair(8);
#if PGK_QZERO == 1
        if (rin) zp[u][t] = pgk_qzero_pair(__ldg(zero + (long long)row * scale_ld + grp));
#endif
        sc[u][t] = 0.0f;
#if PGK_QSK == 1
        // The row's scale for the whole chunk (all four lanes of the row multiply their
        // sum by it), so past K too: the chunk's group, not the lane's column's.
        if (c < c_hi && row >= 0) {
          const int cg = c * CW / PGK_QGROUP;
          const long long at = PGK_QFMT == 1 ? (long long)(row / PGK_QGROUP) * scale_ld + cg
                                             : (long long)row * scale_ld + cg;
          sc[u][t] = __ldg(scale + at);
        }
#endif
        (void)grp;
      }
    }
  };

  float* red = reinterpret_cast<float*>(pgk_qsm);
  unsigned wv[U][NT][LW];
  float sc[U][NT];
  unsigned zp[U][NT];
  bool have = false;
  if (w_early && total > 0) {  // settled weights: load before the wait
    load(0, wv, sc, zp);
    have = true;
  }
  pgk_pdl_wait();
  pgk_pdl_trigger();
  (void)zero;
  if (!have && total > 0) load(0, wv, sc, zp);

  const pgk_t* xr = x + (long long)(xin ? qr : 0) * x_stride;
  const float xs_none[1][2] = {{0.0f, 0.0f}};  // the register path subtracts zero points
  for (int st = 0; st < total; ++st) {
    const int j = st % n_st;
    const int c0 = c_lo + j * U;
    if (j == 0) {
      zero_acc();
      zero_ss();  // the prologue below recomputes them per tile
      eprefetch(first_tile + (st / n_st) * (int)gridDim.x, 0);
    }
#if PGK_QPIPE == 1
    // The next slab's loads go out before this one's multiplies: each lane keeps a slab
    // in flight while it computes (one register set only left the memory idle then).
    unsigned wn[U][NT][LW];
    float scn[U][NT];
    unsigned zpn[U][NT];
    if (st + 1 < total) load(st + 1, wn, scn, zpn);
#endif
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u;
      const int col = c * CW + qc * EPL;
      const bool in = c < c_hi && col < k;
      uint4 xv[1][XV];
#pragma unroll
      for (int jx = 0; jx < XV; ++jx) {
        xv[0][jx] = pgk_gload_x(xr + col + 8 * jx, in && xin);
        if (PGK_PRO == 1) {
          uint4 upper = make_uint4(0u, 0u, 0u, 0u);
          const uint4 gv = pgk_gload_x(pro + col + 8 * jx, in);
          pgk_gprologue(xv[0][jx], upper, gv, false, ss, ss_hi);
        }
      }
      pgk_qchunk<1, NT>(
          acc, xv,
          [&](int t, unsigned (&o)[LW]) {
#pragma unroll
            for (int e = 0; e < LW; ++e) o[e] = wv[u][t][e];
          },
          [&](int t) { return zp[u][t]; }, [&](int t) { return sc[u][t]; }, qmagic, xs_none);
    }
#if PGK_QPIPE == 1
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int e = 0; e < LW; ++e) wv[u][t][e] = wn[u][t][e];
        sc[u][t] = scn[u][t];
        zp[u][t] = zpn[u][t];
      }
#else
    if (st + 1 < total) load(st + 1, wv, sc, zp);
#endif
    if (j == n_st - 1) epilogue(first_tile + (st / n_st) * (int)gridDim.x, red, 0);
  }
#endif
}
#endif
