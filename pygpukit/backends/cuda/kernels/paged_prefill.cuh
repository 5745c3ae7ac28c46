// Paged prefill attention on tensor cores: the prompt pieces of a serving step.
//
// A serving step is B rows of one query each (q [B, H, 1, D]), every row with its own
// block table and length; a prompt piece is a run of consecutive rows of one sequence, so
// their tables are equal and their lengths grow by one a row (the length IS the causal
// mask). pgk_paged_decode reads a row's whole prefix per row; here a block takes PGK_PM
// consecutive rows of PGK_PHG query heads of one KV head (four warps a head), and rows
// whose tables agree share every K / V tile: S = Q K^T and O += P V by mma.sync m16n8k16,
// online softmax in fp32, as attention_flash.cuh, each row masked to its own length, keys
// found through the table. The heads share the block's row bookkeeping, table reads and
// K / V stages.
//
// Which rows are pieces is data, decided on the device the same way by both kernels
// (pgk_paged_piece in paged_decode.cuh: a row with a neighbour of the same first block).
// The decode kernel skips those rows; this one takes only them. A block's piece rows go
// in passes: the row with the longest length not yet done is the anchor, every waiting
// row whose table agrees with the anchor's over its own keys joins the pass, and the pass
// streams the anchor's keys [0, anchor length) through its table (usually one pass; two
// where a tile holds the end of one piece and the start of the next; a row that agrees
// with no other row gets a pass of its own). The grid is fixed (row tiles x head groups,
// head groups fastest); a block with no piece row exits at once.
//
// pools k/v [n_blocks, KV, block_size, D], blocks p_sb elements apart (a block's KV heads
// contiguous, as paged_decode.cuh takes them); table [B, max_blocks] and lens [B]
// int32 (strides t_sb, t_sm, l_s); q rows (strides q_sb, q_sh) and the pools 16-byte
// aligned (the launcher checks); out [B, H, 1, D] contiguous. Masked keys never reach the
// result: keys at or past the anchor's length and keys of a bad block id are zero-filled,
// and a tile that hides keys from some rows with a NaN / inf in its V takes a scalar P V
// that selects the visible keys (attention_flash.cuh's rule). inputs_early (the launcher
// sets it when this kernel follows pgk_paged_decode, whose wait has then already seen
// every operand written): everything up to the stores runs before pgk_pdl_wait, beside
// the decode kernel; only the stores (and the trigger) wait. With PGK_QROPE the Q tile is
// rotated in shared memory by the rows' tables cs / sn [B, D / 2] before its fragments load.
#include "paged_decode.cuh"

#ifndef PGK_PSTAGES
#define PGK_PSTAGES 2  // cp.async K / V stages
#endif
#ifndef PGK_PHG
#define PGK_PHG 1  // query heads a block, of one KV head: they share its K / V tiles
#endif
#define PGK_PW 4                           // warps per head, one m16 row tile each
#define PGK_PM (16 * PGK_PW)               // rows a block
#define PGK_PN 64                          // keys a tile
#define PGK_PT (PGK_PW * 32 * PGK_PHG)     // threads per block
#define PGK_PLD (PGK_D + 8)                // shared-memory row, elements (16-byte pad)
#define PGK_PKS (PGK_D / 16)               // k steps of Q K^T
#define PGK_PDN (PGK_D / 8)                // n tiles of O
#define PGK_PSTAGE (2 * PGK_PN * PGK_PLD)  // one stage: K tile then V tile
#define PGK_PCR (PGK_D / 8)                // 16-byte chunks a row
#define PGK_PRS (PGK_PT / PGK_PCR)         // rows one pass of the block copies
#define PGK_PTAB 256                       // anchor block ids held in shared memory

static_assert(sizeof(pgk_t) == 2, "paged_prefill takes bf16 or f16");
static_assert(PGK_D % 16 == 0, "head_dim must be a multiple of 16");
static_assert(PGK_PSTAGES >= 2, "at least two stages");
static_assert(PGK_PM <= PGK_PT, "a thread per row in the row bookkeeping");
static_assert(PGK_PHG * PGK_PM <= PGK_PSTAGES * 2 * PGK_PN, "Q is staged in the K/V stages");
static_assert(PGK_PT % PGK_PCR == 0 && PGK_PN % PGK_PRS == 0 && PGK_PM % PGK_PRS == 0,
              "whole rows a pass, whole passes a tile");

// 2^x in one instruction (x = -inf gives 0, NaN stays NaN).
PGK_DEVICE float pgk_pexp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Whether either 16-bit element of w is NaN or inf (exponent bits all set).
PGK_DEVICE bool pgk_pnonfinite2(unsigned w) {
  constexpr unsigned e = pgk_dsame<pgk_t, __nv_bfloat16>::value ? 0x7F80u : 0x7C00u;
  return (w & e) == e || ((w >> 16) & e) == e;
}

// Pair (x0, x1) of q's half-split rotation by (c, s), as pgk_paged_q2 rotates it (float
// math, one rounding each).
PGK_DEVICE void pgk_prot(pgk_t& x0, pgk_t& x1, pgk_t c, pgk_t s) {
  const float f0 = pgk_to_float(x0), f1 = pgk_to_float(x1);
  const float cf = pgk_to_float(c), sf = pgk_to_float(s);
  x0 = pgk_from_float<pgk_t>(f0 * cf - f1 * sf);
  x1 = pgk_from_float<pgk_t>(f1 * cf + f0 * sf);
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_paged_prefill)
extern "C" __global__ void __launch_bounds__(PGK_PT)
    pgk_paged_prefill(const pgk_t* __restrict__ q, const pgk_t* __restrict__ kp,
                      const pgk_t* __restrict__ vp, const int* __restrict__ table,
                      const int* __restrict__ lens, pgk_t* __restrict__ o, int rows, int n_heads,
                      int group, int kv_heads, int block_size, int n_blocks, int max_blocks,
                      long long p_sb, float scale, long long q_sb, long long q_sh, long long t_sb,
                      long long t_sm, long long l_s, long long* __restrict__ err, long long tag,
                      int inputs_early, const pgk_t* __restrict__ cs, const pgk_t* __restrict__ sn,
                      long long cs_s) {
  if (!inputs_early) {  // else the operands are settled: see the header
    pgk_pdl_wait();
    pgk_pdl_trigger();
  }
  extern __shared__ __align__(16) unsigned char pgk_psmem[];
  pgk_t* smem = reinterpret_cast<pgk_t*>(pgk_psmem);
  __shared__ int s_len[PGK_PM];    // each row's length, clamped to the table
  __shared__ int s_state[PGK_PM];  // 0 not this kernel's (or done), 1 waiting, 2 this pass
  __shared__ int s_bad[PGK_PM];    // a waiting row whose table differs from the anchor's
  __shared__ int s_anchor, s_min;
  __shared__ int s_tab[PGK_PTAB];  // the pass anchor's block ids (its first PGK_PTAB)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Row tiles last to first: a piece's later rows see more keys, so the longest blocks
  // are dispatched first and the short ones fill in behind them (with one head a block
  // the 1024-token serving step's 512 blocks filled three an SM, 1.29 waves; the second
  // wave had been the step's last rows, the longest).
  // The block's heads h0 .. h0 + PGK_PHG - 1 (the launcher keeps them in one KV group);
  // warp w works on head h0 + w / PGK_PW.
  const int n_hb = n_heads / PGK_PHG, n_rt = (int)(gridDim.x / n_hb);
  const int h0 = (int)(blockIdx.x % n_hb) * PGK_PHG, h = h0 + warp / PGK_PW;
  const int b0 = (n_rt - 1 - (int)(blockIdx.x / n_hb)) * PGK_PM;
  const int kvh = h0 / group;
  const int cap = max_blocks * block_size;

  // Q: staged in the stages (head hh's row r at smem row hh * PGK_PM + r, so warp w's
  // 16 rows start at row 16 w), then held as A fragments for every pass.
  unsigned qf[PGK_PKS][4];
  {
#pragma unroll
    for (int it = 0; it < PGK_PHG * PGK_PM * PGK_PCR / PGK_PT; ++it) {
      const int e = tid + it * PGK_PT, rr = e / PGK_PCR, r = rr % PGK_PM, c = (e % PGK_PCR) * 8;
      const pgk_t* qh = q + (long long)(h0 + rr / PGK_PM) * q_sh;
      const bool in = b0 + r < rows;
      pgk_cp_async16(smem + rr * PGK_PLD + c, in ? qh + (long long)(b0 + r) * q_sb + c : qh, in);
    }
    pgk_cp_async_commit();
#if PGK_QROPE
    // The rows' rope tables in 16-byte pieces (8 pairs) where they are aligned, loaded
    // while Q lands: a pair at a time, the rotation's loads, one after another, had been
    // a fifth of the kernel's stall samples (ncu, H200, the 1024-token mixed step).
    // A thread's pieces of a row rotate that row of every head (staged rows hh * PGK_PM + r).
    constexpr int HALF = PGK_D / 2, RCH = HALF / 8, RIT = (PGK_PM * RCH + PGK_PT - 1) / PGK_PT;
    const bool rvec =
        ((reinterpret_cast<unsigned long long>(cs) | reinterpret_cast<unsigned long long>(sn)) &
         15ull) == 0 &&
        cs_s % 8 == 0;
    uint4 rc[RIT], rsn[RIT];
#pragma unroll
    for (int it = 0; it < RIT; ++it) {
      const int e = tid + it * PGK_PT, r = e / RCH, c = (e % RCH) * 8;
      const bool in = rvec && e < PGK_PM * RCH && b0 + r < rows;
      const long long at = (long long)(b0 + r) * cs_s + c;
      rc[it] = in ? __ldg(reinterpret_cast<const uint4*>(cs + at)) : make_uint4(0, 0, 0, 0);
      rsn[it] = in ? __ldg(reinterpret_cast<const uint4*>(sn + at)) : make_uint4(0, 0, 0, 0);
    }
#endif
    // The rows' lengths and which are pieces, a thread a row, while Q and its rope tables
    // are in flight (the decode kernel reports bad lengths; both clamp them the same way).
    if (tid < PGK_PM) {
      const int b = b0 + tid;
      int len = 0;
      bool piece = false;
      if (b < rows) {
        len = pgk_paged_len(lens, l_s, b, cap);
        piece = pgk_paged_piece(table, t_sb, lens, l_s, b, rows, len, cap);
      }
      s_len[tid] = len;
      s_state[tid] = piece ? 1 : 0;
      s_bad[tid] = 0;
    }
    if (!__syncthreads_or(tid < PGK_PM && s_state[tid] == 1)) {
      pgk_cp_async_wait<0>();  // no piece row: nothing waits on Q
      return;
    }
    pgk_cp_async_wait<0>();
    __syncthreads();
#if PGK_QROPE
    // Rotated in place (pgk_paged_q2's math): row r's table is row b0 + r's (the tables
    // are written before the decode kernel's wait, as q is).
    if (rvec) {
#pragma unroll
      for (int it = 0; it < RIT; ++it) {
        const int e = tid + it * PGK_PT, r = e / RCH, c = (e % RCH) * 8;
        if (e >= PGK_PM * RCH || b0 + r >= rows) continue;
        const pgk_t* cv = reinterpret_cast<const pgk_t*>(&rc[it]);
        const pgk_t* sv = reinterpret_cast<const pgk_t*>(&rsn[it]);
#pragma unroll
        for (int hh = 0; hh < PGK_PHG; ++hh) {
          uint4* lo = reinterpret_cast<uint4*>(smem + (hh * PGK_PM + r) * PGK_PLD + c);
          uint4* hi = reinterpret_cast<uint4*>(smem + (hh * PGK_PM + r) * PGK_PLD + c + HALF);
          uint4 vl = *lo, vh = *hi;
          pgk_t* xl = reinterpret_cast<pgk_t*>(&vl);
          pgk_t* xh = reinterpret_cast<pgk_t*>(&vh);
#pragma unroll
          for (int i = 0; i < 8; ++i) pgk_prot(xl[i], xh[i], cv[i], sv[i]);
          *lo = vl;
          *hi = vh;
        }
      }
    }
#pragma unroll 4
    for (int e = rvec ? PGK_PM * HALF : tid; e < PGK_PM * HALF; e += PGK_PT) {
      const int r = e / HALF, j = e % HALF;
      if (b0 + r >= rows) continue;
      const long long c = (long long)(b0 + r) * cs_s + j;
      const pgk_t cr = cs[c], sr = sn[c];
#pragma unroll
      for (int hh = 0; hh < PGK_PHG; ++hh) {
        pgk_t* x = smem + (hh * PGK_PM + r) * PGK_PLD;
        pgk_prot(x[j], x[j + HALF], cr, sr);
      }
    }
    __syncthreads();
#else
    (void)cs;
    (void)sn;
    (void)cs_s;
#endif
#pragma unroll
    for (int kk = 0; kk < PGK_PKS; ++kk)
      pgk_dldm_x4(qf[kk], smem + (warp * 16 + (lane & 15)) * PGK_PLD + kk * 16 + (lane >> 4) * 8);
  }
  // Scores go through exp2: fold log2(e) into the scale.
  const float qscale = scale * 1.4426950408889634f;
  const int row0 = warp % PGK_PW * 16 + (lane >> 2);  // this thread's rows: row0, row0 + 8
  const long long head_off = (long long)kvh * block_size * PGK_D;
  const long long block_elems = p_sb;  // a block's elements apart
  const int ld_r = tid / PGK_PCR, ld_c = (tid % PGK_PCR) * 8;
  // A key's block and slot: a shift and a mask for a power-of-two block size (the
  // division's emulation, in every key load, was about a fifth of the kernel's work).
  const int bs_sh = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;

  for (;;) {
    // Every thread is done with the last pass's rows, stages and Q staging.
    __syncthreads();
    if (warp == 0) {  // the anchor: the longest waiting row (the first of equals)
      int best = -1, bl = -1;
      for (int r = lane; r < PGK_PM; r += 32)
        if (s_state[r] == 1 && s_len[r] > bl) {
          bl = s_len[r];
          best = r;
        }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const int ol = __shfl_xor_sync(0xffffffffu, bl, off);
        const int ob = __shfl_xor_sync(0xffffffffu, best, off);
        if (ol > bl || (ol == bl && ob >= 0 && (best < 0 || ob < best))) {
          bl = ol;
          best = ob;
        }
      }
      if (lane == 0) {
        s_anchor = best;
        s_min = bl;
      }
    }
    __syncthreads();
    const int a = s_anchor;
    if (a < 0) break;
    const int hi_a = s_len[a];
    // The pass: waiting rows whose table agrees with the anchor's over their own keys
    // (no longer than the anchor's), so every key they see is the anchor's key. Every
    // thread compares entries of every row (rows fastest: the anchor's entry is shared),
    // the loads independent of each other.
    {
      const int* ta = table + (long long)(b0 + a) * t_sb;
      const int na = (hi_a + block_size - 1) / block_size;
      for (int j = tid; j < na && j < PGK_PTAB; j += PGK_PT) s_tab[j] = __ldg(ta + j * t_sm);
#pragma unroll 4
      for (int e = tid; e < PGK_PM * na; e += PGK_PT) {
        const int r = e % PGK_PM, j = e / PGK_PM;
        if (s_state[r] == 1 && j * block_size < s_len[r] &&
            __ldg(table + (long long)(b0 + r) * t_sb + j * t_sm) != __ldg(ta + j * t_sm))
          s_bad[r] = 1;
      }
    }
    __syncthreads();
    if (tid < PGK_PM && s_state[tid] == 1) {
      if (!s_bad[tid]) {
        s_state[tid] = 2;
        atomicMin(&s_min, s_len[tid]);
      }
      s_bad[tid] = 0;
    }
    __syncthreads();
    const int lo_all = s_min;  // every row of the pass sees keys [0, lo_all)
    int hi[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) hi[hr] = s_state[row0 + hr * 8] == 2 ? s_len[row0 + hr * 8] : 0;
    const int* tab = table + (long long)(b0 + a) * t_sb;
    const int t_end = (hi_a + PGK_PN - 1) / PGK_PN;

    // Keys at or past hi_a, and keys of a block id outside the pool (reported), read as
    // zeros.
    auto load_kv = [&](int t, int stage) {
      if (t >= t_end) return;
      pgk_t* ks = smem + stage * PGK_PSTAGE + ld_r * PGK_PLD + ld_c;
#pragma unroll
      for (int it = 0; it < PGK_PN / PGK_PRS; ++it) {
        const int j = t * PGK_PN + ld_r + it * PGK_PRS;
        bool in = j < hi_a;
        long long off = 0;
        if (in) {
          const int bj = bs_sh >= 0 ? j >> bs_sh : j / block_size;
          const int blk = bj < PGK_PTAB ? s_tab[bj] : __ldg(tab + (long long)bj * t_sm);
          if (blk < 0 || blk >= n_blocks) {
            if (ld_c == 0) pgk_paged_report(err, tag, blk, n_blocks);
            in = false;
          } else {
            off = blk * block_elems + head_off + (long long)(j - bj * block_size) * PGK_D + ld_c;
          }
        }
        pgk_cp_async16(ks + it * PGK_PRS * PGK_PLD, kp + off, in);
        pgk_cp_async16(ks + (PGK_PN + it * PGK_PRS) * PGK_PLD, vp + off, in);
      }
    };

    float acc[PGK_PDN][4];
    float m[2] = {-PGK_INF, -PGK_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < PGK_PDN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < PGK_PSTAGES - 1; ++s) {
      load_kv(s, s);
      pgk_cp_async_commit();
    }

    // One key tile: S = Q K^T, online softmax, O += P V. kMasked: some row of the block
    // does not see every key of the tile (rows outside the pass see none).
    auto tile = [&](int t, const bool kMasked) {
      const pgk_t* ks = smem + (t % PGK_PSTAGES) * PGK_PSTAGE;
      const pgk_t* vs = ks + PGK_PN * PGK_PLD;
      const int j0 = t * PGK_PN;
      float s[PGK_PN / 8][4];
#pragma unroll
      for (int n = 0; n < PGK_PN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < PGK_PKS; ++kk)
#pragma unroll
        for (int n = 0; n < PGK_PN / 8; n += 2) {
          unsigned kb[4];
          const int r = n * 8 + (lane & 7) + (lane >> 4) * 8;
          pgk_dldm_x4(kb, ks + r * PGK_PLD + kk * 16 + ((lane >> 3) & 1) * 8);
          pgk_dmma(s[n], qf[kk], kb[0], kb[1]);
          pgk_dmma(s[n + 1], qf[kk], kb[2], kb[3]);
        }
      // Online softmax, two rows a thread; a row's scores lie in one quad.
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = m[hr];
#pragma unroll
        for (int n = 0; n < PGK_PN / 8; ++n)
#pragma unroll
          for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
            float x = s[n][e] * qscale;
            if (kMasked) x = j0 + n * 8 + (lane & 3) * 2 + (e & 1) < hi[hr] ? x : -PGK_INF;
            s[n][e] = x;
            mx = fmaxf(mx, x);  // skips NaN: a NaN score stays NaN as p
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row that has seen no visible key keeps max -inf: subtract 0 instead, so its
        // masked scores give exp2(-inf) = 0 rather than NaN.
        const float base = mx == -PGK_INF ? 0.0f : mx;
        const float alpha = pgk_pexp2(m[hr] - base);
        m[hr] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < PGK_PN / 8; ++n)
#pragma unroll
          for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
            s[n][e] = pgk_pexp2(s[n][e] - base);
            sum += s[n][e];
          }
        l[hr] = l[hr] * alpha + sum;  // this thread's part; the quad sums at the end
#pragma unroll
        for (int n = 0; n < PGK_PDN; ++n) {
          acc[n][2 * hr] *= alpha;
          acc[n][2 * hr + 1] *= alpha;
        }
      }
      // A masked tile with a NaN / inf in its V: the scalar P V below (the condition is
      // the block's, so the barrier is uniform).
      bool scalar_pv = false;
      if (kMasked) {
        bool bad = false;
        constexpr int words = PGK_PN * PGK_D / 2;
        for (int e = tid; e < words; e += PGK_PT) {
          const int r = e / (PGK_D / 2), c = (e % (PGK_D / 2)) * 2;
          bad |= pgk_pnonfinite2(*reinterpret_cast<const unsigned*>(vs + r * PGK_PLD + c));
        }
        scalar_pv = __syncthreads_or(bad);
      }
      if (!scalar_pv) {
#pragma unroll
        for (int kk = 0; kk < PGK_PN / 16; ++kk) {
          unsigned pa[4];
          pa[0] = pgk_dpack(s[2 * kk][0], s[2 * kk][1]);
          pa[1] = pgk_dpack(s[2 * kk][2], s[2 * kk][3]);
          pa[2] = pgk_dpack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
          pa[3] = pgk_dpack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
          for (int n = 0; n < PGK_PDN; n += 2) {
            unsigned vb[4];
            const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            pgk_dldm_x4_t(vb, vs + r * PGK_PLD + n * 8 + (lane >> 4) * 8);
            pgk_dmma(acc[n], pa, vb[0], vb[1]);
            pgk_dmma(acc[n + 1], pa, vb[2], vb[3]);
          }
        }
      } else {
        // Key n * 8 + 2 * c + e of the tile sits in quad lane c, register n, element e; a
        // hidden key is skipped (selected out), never multiplied.
#pragma unroll
        for (int n = 0; n < PGK_PN / 8; ++n)
#pragma unroll 1
          for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int jj = n * 8 + 2 * c + e;
              const pgk_t* vr = vs + jj * PGK_PLD + (lane & 3) * 2;
#pragma unroll
              for (int hr = 0; hr < 2; ++hr) {
                const float p = __shfl_sync(0xffffffffu, s[n][2 * hr + e], (lane & ~3) | c);
                if (j0 + jj < hi[hr]) {
#pragma unroll
                  for (int dn = 0; dn < PGK_PDN; ++dn) {
                    acc[dn][2 * hr] += p * pgk_to_float(vr[dn * 8]);
                    acc[dn][2 * hr + 1] += p * pgk_to_float(vr[dn * 8 + 1]);
                  }
                }
              }
            }
      }
    };

    for (int t = 0; t < t_end; ++t) {
      // Tile t has landed, and every thread is done with the stage the prefetch below
      // overwrites.
      pgk_cp_async_wait<PGK_PSTAGES - 2>();
      __syncthreads();
      load_kv(t + PGK_PSTAGES - 1, (t + PGK_PSTAGES - 1) % PGK_PSTAGES);
      pgk_cp_async_commit();  // possibly empty: keeps the group count uniform
      if ((t + 1) * PGK_PN <= lo_all)
        tile(t, false);
      else
        tile(t, true);
    }

    if (inputs_early) {  // the stores wait for the kernels before (see the header)
      pgk_pdl_wait();
      pgk_pdl_trigger();
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float sum = l[hr];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int b = b0 + row0 + hr * 8;
      if (hi[hr] == 0 || b >= rows) continue;  // not this pass's row
      // A NaN sum (NaN or inf in what the row sees) stays NaN.
      const float inv = 1.0f / sum;
      pgk_t* orow = o + ((long long)b * n_heads + h) * PGK_D + (lane & 3) * 2;
#pragma unroll
      for (int n = 0; n < PGK_PDN; ++n)
        pgk_from_acc2(acc[n][2 * hr] * inv, acc[n][2 * hr + 1] * inv, orow + n * 8);
    }
    __syncthreads();  // every thread has read this pass's states
    if (tid < PGK_PM && s_state[tid] == 2) s_state[tid] = 0;
  }
}
#endif
