// Tensor-core flash attention for prefill (bf16 / fp16, SM 8.0+):
//   O = softmax(scale Q K^T + masks) V, online softmax in fp32, scores never in global memory.
//
// Q, O: [batch, heads, seq_q, D]; K, V: [batch, kv_heads, seq_k, D]; every operand has its
// own batch/head/seq strides in elements (D contiguous, rows 16-byte aligned: the launcher
// checks). GQA: query head h reads kv head h / (heads / kv_heads).
// Masks (pgk_attn_rows in common.cuh, the NumPy backend's rules): kv_len L (device int,
// null = seq_k) hides keys >= L; kv_start[b * kvs_stride] (device ints, null = 0) hides
// keys before it (kv_wide bit 0 / bit 1: kv_len / kv_start are int64, else int32);
// causal hides keys j > i + L - seq_q (bottom-right aligned at L); window w > 0 hides keys
// j <= i + L - seq_q - w. Bad L / kv_start are reported through the error word (err, tag)
// and clamped. A query that sees no key gets zeros.
//
// Block: PGK_FW warps, each owning PGK_FR m16 row tiles (16 * PGK_FR query rows), so
// PGK_FM = 16 * PGK_FW * PGK_FR rows a block; keys in tiles of PGK_FN. K and V tiles
// stream through PGK_FSTAGES shared-memory stages by cp.async (tile t + stages - 1 is
// fetched while tile t is used; one barrier a tile), rows padded by 16 bytes so the
// ldmatrix phases are conflict-free. Q's A fragments live in registers (PGK_FQR 1, read
// once) or are re-read from a shared-memory Q tile each key tile (PGK_FQR 0: fewer
// registers, which lets a warp own two row tiles at head dim 128). S = Q K^T and O += P V
// by mma.sync m16n8k16 with fp32 accumulators (V through ldmatrix.trans, P converted to A
// fragments in registers). Tiles every row of the block sees whole take a tile body with
// no mask at all; the masked body (causal diagonal, window edge, kv_len / kv_start edges)
// is a separate instantiation, so the common case carries none of its work. Tiles no row
// sees are never loaded (causal: the block's key range ends at its last row's diagonal).
// The grid is 1-D, heads fastest: every head's last (longest causal) query block starts
// before any head's shorter ones, and the query heads of one kv head run side by side,
// sharing its K / V tiles in L2.
//
// Masked keys never reach the result: keys outside [kv_start, L) are zero-filled by
// cp.async (a static cache's unwritten tail may hold NaN), and in a tile that hides a key
// from some rows only (the causal diagonal, the window's edge) a V row holding NaN or inf
// would still give 0 * NaN in the tensor-core P V, so such a tile (rare: the block checks
// its V) takes a scalar P V that selects the visible keys instead of multiplying.
#include "common.cuh"

#ifndef PGK_D
#define PGK_D 128
#endif
#ifndef PGK_FW
#define PGK_FW 4  // warps per block
#endif
#ifndef PGK_FR
#define PGK_FR 1  // m16 row tiles per warp
#endif
#ifndef PGK_FN
#define PGK_FN 64  // keys per tile
#endif
#ifndef PGK_FSTAGES
#define PGK_FSTAGES 2  // cp.async K / V stages
#endif
#ifndef PGK_FQR
#define PGK_FQR 1  // 1: Q fragments in registers; 0: re-read from shared memory
#endif
#ifndef PGK_FMINB
#define PGK_FMINB 1  // blocks an SM the register allocation leaves room for
#endif
#ifndef PGK_ERR_INDEX
#define PGK_ERR_INDEX 1
#endif
#define PGK_FM (16 * PGK_FW * PGK_FR)  // query rows per block
#define PGK_FLD (PGK_D + 8)            // shared-memory row, elements (16-byte pad)
#define PGK_FKS (PGK_D / 16)           // k steps of Q K^T
#define PGK_FDN (PGK_D / 8)            // n tiles of O
#define PGK_FSTAGE (2 * PGK_FN * PGK_FLD)  // one stage: K tile then V tile
#define PGK_FQ (PGK_FQR ? 0 : PGK_FM * PGK_FLD)  // the resident Q tile (PGK_FQR 0)
#define PGK_FT (PGK_FW * 32)               // threads per block
#define PGK_FCR (PGK_D / 8)                // 16-byte chunks a row
#define PGK_FRS (PGK_FT / PGK_FCR)         // rows one pass of the block copies

static_assert(sizeof(pgk_t) == 2, "attention_flash takes bf16 or f16");
static_assert(PGK_D % 16 == 0, "head_dim must be a multiple of 16");
static_assert(PGK_FN % 16 == 0, "keys per tile must be a multiple of 16");
static_assert(PGK_FSTAGES >= 2, "at least two stages");
static_assert(!PGK_FQR || PGK_FM <= 2 * PGK_FN, "the Q tile is staged in one K/V stage");
static_assert(PGK_FT % PGK_FCR == 0 && PGK_FN % PGK_FRS == 0 && PGK_FM % PGK_FRS == 0,
              "whole rows a pass, whole passes a tile");

PGK_DEVICE void pgk_fldm_x4_t(unsigned* r, const void* smem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
PGK_DEVICE void pgk_fmma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  if constexpr (pgk_same<pgk_t, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// Two fp32 values as one register of two pgk_t (lo in the low half).
PGK_DEVICE unsigned pgk_fpack(float lo, float hi) {
  pgk_t h[2];
  pgk_from_acc2(lo, hi, h);
  return *reinterpret_cast<unsigned*>(h);
}
// 2^x in one instruction (x = -inf gives 0, NaN stays NaN).
PGK_DEVICE float pgk_fexp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Whether either 16-bit element of w is NaN or inf (exponent bits all set).
PGK_DEVICE bool pgk_fnonfinite2(unsigned w) {
  constexpr unsigned e = pgk_same<pgk_t, __nv_bfloat16>::value ? 0x7F80u : 0x7C00u;
  return (w & e) == e || ((w >> 16) & e) == e;
}

extern "C" __global__ void __launch_bounds__(PGK_FT, PGK_FMINB)
    pgk_attention_flash(const pgk_t* __restrict__ q, const pgk_t* __restrict__ k,
                        const pgk_t* __restrict__ v, pgk_t* __restrict__ o, int n_heads,
                        int n_kv_heads, int seq_q, int seq_k, float scale, int causal,
                        int window, const int* __restrict__ kv_len,
                        const int* __restrict__ kv_start, long long kvs_stride, int kv_wide,
                        long long q_sb,
                        long long q_sh, long long q_ss, long long k_sb, long long k_sh,
                        long long k_ss, long long v_sb, long long v_sh, long long v_ss,
                        long long o_sb, long long o_sh, long long o_ss,
                        long long* __restrict__ err, long long tag) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  extern __shared__ __align__(16) unsigned char pgk_fsmem[];
  pgk_t* smem = reinterpret_cast<pgk_t*>(pgk_fsmem);
  pgk_t* kv_smem = smem + PGK_FQ;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Heads fastest, query blocks last-first (see the header).
  const int n_q_blocks = (seq_q + PGK_FM - 1) / PGK_FM;
  const int bh_all = (int)(gridDim.x / n_q_blocks);  // batch * heads
  const int bh = (int)(blockIdx.x % bh_all);
  const int qblock = n_q_blocks - 1 - (int)(blockIdx.x / bh_all);
  const int b = bh / n_heads, h = bh % n_heads;
  const int kvh = h / (n_heads / n_kv_heads);
  const int q0 = qblock * PGK_FM;
  q += b * q_sb + h * q_sh;
  o += b * o_sb + h * o_sh;
  k += b * k_sb + kvh * k_sh;
  v += b * v_sb + kvh * v_sh;

  int len, start;
  pgk_attn_bounds(kv_len, kv_start, kvs_stride, kv_wide, b, seq_k,
                  tid == 0 && (int)blockIdx.x < bh_all && h == 0 ? err : nullptr, tag,
                  PGK_ERR_INDEX, len, start);  // one block a batch row reports
  // The block's key range: the first row's lower end to the last row's upper end (both
  // grow with the row).
  const int last = min(q0 + PGK_FM, seq_q) - 1;
  int lo_first, hi_first, lo_last, hi_last;
  pgk_attn_rows(q0, seq_q, len, start, causal, window, lo_first, hi_first);
  pgk_attn_rows(last, seq_q, len, start, causal, window, lo_last, hi_last);
  const int t_begin = lo_first / PGK_FN;
  const int t_end = hi_last > lo_first ? (hi_last + PGK_FN - 1) / PGK_FN : t_begin;
  const bool per_row = causal || window > 0;  // masks that differ between rows
  // This thread's first row (fragment row lane / 4 of its first m tile).
  const int row0 = q0 + warp * PGK_FR * 16 + (lane >> 2);
  // pgk_attn_rows of row row0 + off (0 <= off < 16 * PGK_FR) with the causal / window
  // choices made once: branch-free in the tile loop, where NVVM would otherwise unswitch
  // the mask step into a copy per choice.
  const int pos0 = row0 + len - seq_q;
  const int hi_cap = causal ? pos0 + 1 : len;
  const int lo_floor = window > 0 ? pos0 - window + 1 : start - 16 * PGK_FR;
  auto row_bounds = [&](int off, int& lo, int& hi) {
    lo = max(start, lo_floor + off);
    hi = min(len, hi_cap + off);
  };

  // K and V rows outside [start, len) are zero-filled: never read, and a zero V row
  // contributes nothing however its probability is formed. Tiles past t_end: nothing.
  // Thread tid copies 16-byte chunk tid % PGK_FCR of rows tid / PGK_FCR + i * PGK_FRS:
  // one row pointer a tensor, stepped, so few registers hold addresses.
  const int ld_r = tid / PGK_FCR, ld_c = (tid % PGK_FCR) * 8;
  auto load_kv = [&](int t, int stage) {
    if (t >= t_end) return;
    pgk_t* ks = kv_smem + stage * PGK_FSTAGE + ld_r * PGK_FLD + ld_c;
    int j = t * PGK_FN + ld_r;
    const pgk_t* kp = k + j * k_ss + ld_c;
    const pgk_t* vp = v + j * v_ss + ld_c;
#pragma unroll
    for (int it = 0; it < PGK_FN / PGK_FRS; ++it) {
      const bool in = j >= start && j < len;
      pgk_cp_async16(ks + it * PGK_FRS * PGK_FLD, in ? kp : k, in);
      pgk_cp_async16(ks + (PGK_FN + it * PGK_FRS) * PGK_FLD, in ? vp : v, in);
      kp += PGK_FRS * k_ss;
      vp += PGK_FRS * v_ss;
      j += PGK_FRS;
    }
  };

  float acc[PGK_FR][PGK_FDN][4];
  float m[PGK_FR][2], l[PGK_FR][2];
#pragma unroll
  for (int f = 0; f < PGK_FR; ++f) {
#pragma unroll
    for (int n = 0; n < PGK_FDN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[f][n][e] = 0.0f;
    m[f][0] = m[f][1] = -PGK_INF;
    l[f][0] = l[f][1] = 0.0f;
  }
  // Scores go through exp2: fold log2(e) into the scale.
  const float qscale = scale * 1.4426950408889634f;

  // Q: the resident tile (PGK_FQR 0) or staged in the last K/V stage, which the first
  // iteration's prefetch overwrites only after the barrier that follows the read-out.
  pgk_t* qs = PGK_FQR ? kv_smem + (PGK_FSTAGES - 1) * PGK_FSTAGE : smem;
  unsigned qf[PGK_FQR ? PGK_FR : 1][PGK_FQR ? PGK_FKS : 1][4];
  if (t_begin < t_end) {
#pragma unroll
    for (int it = 0; it < PGK_FM * (PGK_D / 8) / PGK_FT; ++it) {
      const int e = tid + it * PGK_FT, r = e / (PGK_D / 8), c = (e % (PGK_D / 8)) * 8;
      const bool in = q0 + r < seq_q;
      pgk_cp_async16(qs + r * PGK_FLD + c, in ? q + (q0 + r) * q_ss + c : q, in);
    }
    // Prologue: tiles t_begin .. t_begin + stages - 2, one commit group each (Q with the
    // first), some possibly empty, so the count in the loop stays uniform.
#pragma unroll
    for (int s = 0; s < PGK_FSTAGES - 1; ++s) {
      load_kv(t_begin + s, s);
      pgk_cp_async_commit();
    }
    if constexpr (PGK_FQR) {
      pgk_cp_async_wait<PGK_FSTAGES - 2>();
      __syncthreads();
#pragma unroll
      for (int f = 0; f < PGK_FR; ++f)
#pragma unroll
        for (int kk = 0; kk < PGK_FKS; ++kk) {
          const int r = (warp * PGK_FR + f) * 16 + (lane & 15);
          pgk_ldmatrix_x4(qf[f][kk], qs + r * PGK_FLD + kk * 16 + (lane >> 4) * 8);
        }
    }
  }

  // One key tile: S = Q K^T, online softmax, O += P V. masked: the tile hides keys from
  // some rows (per-row bounds, the V NaN check); else every row sees every key. Called
  // with a constant at two sites, each inlined copy folds its branches (a generic lambda
  // would say so in the type, but older NVRTC takes it for a host function), so the
  // unmasked tile is one straight block. One copy for both, the mask and the P V behind
  // branches on a runtime flag, compiled 1.3x faster but ran 6% slower on an H200.
  auto tile = [&](int t, const bool masked) {
    const int stage = (t - t_begin) % PGK_FSTAGES;
    const pgk_t* ks = kv_smem + stage * PGK_FSTAGE;
    const pgk_t* vs = ks + PGK_FN * PGK_FLD;
    const int j0 = t * PGK_FN;

    float s[PGK_FR][PGK_FN / 8][4];
#pragma unroll
    for (int f = 0; f < PGK_FR; ++f)
#pragma unroll
      for (int n = 0; n < PGK_FN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[f][n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < PGK_FKS; ++kk) {
      unsigned qa[PGK_FR][4];
#pragma unroll
      for (int f = 0; f < PGK_FR; ++f) {
        if constexpr (PGK_FQR) {
#pragma unroll
          for (int x = 0; x < 4; ++x) qa[f][x] = qf[PGK_FQR ? f : 0][PGK_FQR ? kk : 0][x];
        } else {
          const int r = (warp * PGK_FR + f) * 16 + (lane & 15);
          pgk_ldmatrix_x4(qa[f], qs + r * PGK_FLD + kk * 16 + (lane >> 4) * 8);
        }
      }
#pragma unroll
      for (int n = 0; n < PGK_FN / 8; n += 2) {
        unsigned kb[4];
        const int r = n * 8 + (lane & 7) + (lane >> 4) * 8;
        pgk_ldmatrix_x4(kb, ks + r * PGK_FLD + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int f = 0; f < PGK_FR; ++f) {
          pgk_fmma(s[f][n], qa[f], kb[0], kb[1]);
          pgk_fmma(s[f][n + 1], qa[f], kb[2], kb[3]);
        }
      }
    }

#pragma unroll
    for (int f = 0; f < PGK_FR; ++f)
#pragma unroll
      for (int n = 0; n < PGK_FN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[f][n][e] *= qscale;
    // Hidden keys: -inf, after the scale (a negative or NaN scale must not turn it).
    if (masked) {
#pragma unroll
      for (int f = 0; f < PGK_FR; ++f)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          int lo, hi;
          row_bounds(f * 16 + hr * 8, lo, hi);
          // key j0 + n * 8 + jc + (e & 1) of this thread, against bounds moved by j0 + jc
          const int jc = (lane & 3) * 2;
          lo -= j0 + jc;
          hi -= j0 + jc;
#pragma unroll
          for (int n = 0; n < PGK_FN / 8; ++n)
#pragma unroll
            for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
              const int j = n * 8 + (e & 1);
              s[f][n][e] = j >= lo && j < hi ? s[f][n][e] : -PGK_INF;
            }
        }
    }

    // Online softmax, two rows a thread per m tile; a row's scores lie in one quad.
#pragma unroll
    for (int f = 0; f < PGK_FR; ++f) {
      float mx[2] = {m[f][0], m[f][1]};
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int n = 0; n < PGK_FN / 8; ++n)
#pragma unroll
          for (int e = 2 * hr; e < 2 * hr + 2; ++e)
            mx[hr] = fmaxf(mx[hr], s[f][n][e]);  // skips NaN: a NaN score stays NaN as p
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        // A row that has seen no visible key keeps max -inf: subtract 0 instead, so its
        // masked scores give exp2(-inf) = 0 rather than NaN.
        const float base = mx[hr] == -PGK_INF ? 0.0f : mx[hr];
        const float alpha = pgk_fexp2(m[f][hr] - base);
        m[f][hr] = mx[hr];
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < PGK_FN / 8; ++n)
#pragma unroll
          for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
            s[f][n][e] = pgk_fexp2(s[f][n][e] - base);
            sum += s[f][n][e];
          }
        l[f][hr] = l[f][hr] * alpha + sum;  // this thread's part; the quad sums at the end
#pragma unroll
        for (int n = 0; n < PGK_FDN; ++n) {
          acc[f][n][2 * hr] *= alpha;
          acc[f][n][2 * hr + 1] *= alpha;
        }
      }
    }

    // A tile that hides keys from some rows only, with a NaN / inf in its V: the scalar
    // P V below. The condition is the block's, so the barrier is uniform.
    bool scalar_pv = false;
    if (masked) {
      if (per_row) {
        bool bad = false;
        constexpr int words = PGK_FN * PGK_D / 2;
        for (int e = tid; e < words; e += PGK_FT) {
          const int r = e / (PGK_D / 2), c = (e % (PGK_D / 2)) * 2;
          bad |= pgk_fnonfinite2(*reinterpret_cast<const unsigned*>(vs + r * PGK_FLD + c));
        }
        scalar_pv = __syncthreads_or(bad);
      }
    }
    if (!scalar_pv) {
#pragma unroll
      for (int kk = 0; kk < PGK_FN / 16; ++kk) {
        unsigned pa[PGK_FR][4];
#pragma unroll
        for (int f = 0; f < PGK_FR; ++f) {
          pa[f][0] = pgk_fpack(s[f][2 * kk][0], s[f][2 * kk][1]);
          pa[f][1] = pgk_fpack(s[f][2 * kk][2], s[f][2 * kk][3]);
          pa[f][2] = pgk_fpack(s[f][2 * kk + 1][0], s[f][2 * kk + 1][1]);
          pa[f][3] = pgk_fpack(s[f][2 * kk + 1][2], s[f][2 * kk + 1][3]);
        }
#pragma unroll
        for (int n = 0; n < PGK_FDN; n += 2) {
          unsigned vb[4];
          const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          pgk_fldm_x4_t(vb, vs + r * PGK_FLD + n * 8 + (lane >> 4) * 8);
#pragma unroll
          for (int f = 0; f < PGK_FR; ++f) {
            pgk_fmma(acc[f][n], pa[f], vb[0], vb[1]);
            pgk_fmma(acc[f][n + 1], pa[f], vb[2], vb[3]);
          }
        }
      }
    } else {
      // Key jj of the tile: its probability for a row sits in quad lane (jj >> 1) & 3,
      // register s[f][jj >> 3][2 * hr + (jj & 1)]; a hidden key is skipped (selected out),
      // never multiplied. One key an iteration, never unrolled: the path is rare, and an
      // unrolled copy was most of the kernel's code (and of its compile time).
      int lo[PGK_FR][2], hi[PGK_FR][2];
#pragma unroll
      for (int f = 0; f < PGK_FR; ++f)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          row_bounds(f * 16 + hr * 8, lo[f][hr], hi[f][hr]);
#pragma unroll 1
      for (int jj = 0; jj < PGK_FN; ++jj) {
        const int n = jj >> 3, e = jj & 1, src = (lane & ~3) | ((jj >> 1) & 3);
        const pgk_t* vr = vs + jj * PGK_FLD + (lane & 3) * 2;
        float vf[PGK_FDN][2];
#pragma unroll
        for (int dn = 0; dn < PGK_FDN; ++dn) {
          vf[dn][0] = pgk_to_float(vr[dn * 8]);
          vf[dn][1] = pgk_to_float(vr[dn * 8 + 1]);
        }
#pragma unroll
        for (int f = 0; f < PGK_FR; ++f)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            float mine = 0.0f;
#pragma unroll
            for (int nn = 0; nn < PGK_FN / 8; ++nn)
              mine = nn == n ? (e ? s[f][nn][2 * hr + 1] : s[f][nn][2 * hr]) : mine;
            const float p = __shfl_sync(0xffffffffu, mine, src);
            const int j = j0 + jj;
            if (j >= lo[f][hr] && j < hi[f][hr]) {
#pragma unroll
              for (int dn = 0; dn < PGK_FDN; ++dn) {
                acc[f][dn][2 * hr] += p * vf[dn][0];
                acc[f][dn][2 * hr + 1] += p * vf[dn][1];
              }
            }
          }
      }
    }
  };

  for (int t = t_begin; t < t_end; ++t) {
    // Tile t has landed (the groups after it: the stages - 2 tiles fetched ahead), and
    // every thread is done with the stage read in the last iteration (or with Q), which
    // the prefetch below then overwrites.
    pgk_cp_async_wait<PGK_FSTAGES - 2>();
    __syncthreads();
    load_kv(t + PGK_FSTAGES - 1, (t - t_begin + PGK_FSTAGES - 1) % PGK_FSTAGES);
    pgk_cp_async_commit();  // possibly empty: keeps the group count uniform
    const int j0 = t * PGK_FN;
    // Every row of the block sees every key of the tile: no mask.
    if (j0 >= lo_last && j0 + PGK_FN <= hi_first)
      tile(t, false);
    else
      tile(t, true);
  }

#pragma unroll
  for (int f = 0; f < PGK_FR; ++f)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float sum = l[f][hr];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int i = row0 + f * 16 + hr * 8;
      if (i >= seq_q) continue;
      // No visible key: zeros. A NaN sum (NaN or inf in what the row sees) stays NaN, and
      // so does a zero sum over visible keys (every score -inf: exp(-inf - -inf) is NaN).
      int lo, hi;
      row_bounds(f * 16 + hr * 8, lo, hi);
      const float empty = lo < hi ? __int_as_float(0x7fc00000) : 0.0f;
      const float inv = 1.0f / sum;
      pgk_t* orow = o + i * o_ss + (lane & 3) * 2;
#pragma unroll
      for (int n = 0; n < PGK_FDN; ++n) {
        const float a0 = sum == 0.0f ? empty : acc[f][n][2 * hr] * inv;
        const float a1 = sum == 0.0f ? empty : acc[f][n][2 * hr + 1] * inv;
        pgk_from_acc2(a0, a1, orow + n * 8);
      }
    }
}
