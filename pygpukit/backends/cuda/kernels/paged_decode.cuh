// Paged decode attention: decode attention reading its keys and values through per-row
// block tables (the serving engine's paged KV cache). Two bodies, one launch rule:
// pgk_paged_decode_mma (bf16 / f16, one query a row: the serving step's decode rows) on
// tensor cores, pgk_paged_decode (any float dtype, several queries a row) on CUDA cores.
//
// pools k/v [n_blocks, KV, block_size, D], blocks p_sb elements apart (a block's KV heads
// contiguous: pools of their own, or the key and value halves of one pool [n_blocks, 2 KV,
// block_size, D]); table [B, max_blocks] and lens [B]
// int32 (element strides t_sb, t_sm, l_s); q [B, H, n_q, D] (strides q_sb, q_sh, q_st; D
// contiguous); out [B, H, n_q, D] contiguous. Query qi of row b sits at position
// lens[b] - n_q + qi and sees keys [0, position]; a query that sees none gets zeros.
// grid (splits, KV * group / PGK_G, B * n_q): one block serves PGK_G query heads of one kv
// head (the whole GQA group up to 16), so each K/V byte of its share is read once.
// pgk_paged_decode, PGK_DT threads: tiles, scores, online softmax and P.V are
// pgk_dec_split_body's, shared with pgk_attn_decode_split: only the key -> row lookup
// (through the block table) differs.
// With pieces set (one query a row, launched with pgk_paged_prefill after it), the rows
// of prompt pieces (pgk_paged_piece) are left to that kernel.
// With one split the block normalises and writes out; with several (n_q == 1 only) each
// writes its partial and (max, sum) pair and pgk_attn_decode_reduce (attention_decode.cuh,
// launched after it with the same defines) merges them. A length outside [0, max_blocks *
// block_size] or a block id outside the pool goes to the error word (IndexError at the
// next synchronisation); the kernel clamps or skips it rather than read outside the pool.
#include "attention_decode.cuh"

PGK_DEVICE void pgk_paged_report(long long* err, long long tag, long long value, long long limit) {
  if (err && atomicCAS(reinterpret_cast<unsigned long long*>(err), 0ull, PGK_ERR_INDEX) == 0ull) {
    err[1] = tag;
    err[2] = value;
    err[3] = limit;
  }
}

// A length clamped to the table's keys [0, cap].
PGK_DEVICE int pgk_paged_clamp(int len, int cap) { return len < 0 ? 0 : (len > cap ? cap : len); }

// Row b's length, clamped (pgk_paged_decode reports a bad one).
PGK_DEVICE int pgk_paged_len(const int* __restrict__ lens, long long l_s, int b, int cap) {
  return pgk_paged_clamp(__ldg(lens + b * l_s), cap);
}

// Row b's length as pgk_paged_len clamps it; a length outside [0, cap] is reported where
// `report` (one thread of the launch's first block row a row reports it).
PGK_DEVICE int pgk_paged_len_checked(const int* __restrict__ lens, long long l_s, int b, int cap,
                                     long long* err, long long tag, bool report) {
  const int len = __ldg(lens + b * l_s);
  if ((len < 0 || len > cap) && report) pgk_paged_report(err, tag, len, cap);
  return pgk_paged_clamp(len, cap);
}

// Whether row b (length len) is a prompt piece's, which pgk_paged_prefill
// (paged_prefill.cuh) attends on tensor cores: it has keys, and so has a neighbouring row
// whose first block is b's (a decode row, one row a sequence, has none: sequences own
// their blocks). Both kernels decide it this way, so each row is attended by exactly one;
// the piece kernel checks the rest of the tables before it shares keys between rows. One
// thread's answer, from loads that do not wait on each other.
PGK_DEVICE bool pgk_paged_piece(const int* __restrict__ table, long long t_sb,
                                const int* __restrict__ lens, long long l_s, int b, int rows,
                                int len, int cap) {
  if (cap <= 0) return false;  // a table of no blocks: no row has keys
  const int first = __ldg(table + b * t_sb);
  bool near = false;
  for (int y = b - 1; y <= b + 1; y += 2) {
    if (y < 0 || y >= rows) continue;
    const int ly = pgk_paged_len(lens, l_s, y, cap), ty = __ldg(table + y * t_sb);
    near |= (ly > 0) & (ty == first);
  }
  return len > 0 && near;
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_paged_decode)
extern "C" __global__ void __launch_bounds__(PGK_DT)
    pgk_paged_decode(const pgk_t* __restrict__ q, const pgk_t* __restrict__ kp,
                     const pgk_t* __restrict__ vp, const int* __restrict__ table,
                     const int* __restrict__ lens, float* __restrict__ o_part,
                     float* __restrict__ ml_part, pgk_t* __restrict__ o, int n_heads, int group,
                     int n_q, int kv_heads, int block_size, int n_blocks, int max_blocks,
                     long long p_sb, float scale, long long q_sb, long long q_sh, long long q_st,
                     long long t_sb, long long t_sm, long long l_s, long long* __restrict__ err,
                     long long tag, int pieces) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const int tid = threadIdx.x;
  const int split = blockIdx.x, splits = gridDim.x;
  const int n_sub = group / PGK_G;
  const int kvh = blockIdx.y / n_sub, qi = blockIdx.z % n_q, b = blockIdx.z / n_q;
  const int h0 = kvh * group + (blockIdx.y % n_sub) * PGK_G;
  // The partial slots are indexed by (row, head) as the merge kernel reads them: only a
  // one-query launch (n_q == 1, blockIdx.z == b) has several splits.
  const long long part = ((long long)blockIdx.z * n_heads + h0) * splits + split;
  // out [B, H, n_q, D] contiguous: heads n_q * D apart.
  const long long o_sh = (long long)n_q * PGK_D;
  o += ((long long)b * n_heads + h0) * o_sh + (long long)qi * PGK_D;
  q += b * q_sb + qi * q_st;

  int start, end;
  {
    const int cap = max_blocks * block_size;
    int len = pgk_paged_len_checked(lens, l_s, b, cap, err, tag,
                                    tid == 0 && blockIdx.x == 0 && blockIdx.y == 0);
    // The query's position is len - n_q + qi: it sees keys [0, that + 1). With pieces
    // (n_q == 1), a prompt piece's row is pgk_paged_prefill's, launched after this one
    // (and after the merge, which writes the row's zeros): one split writes nothing.
    int hi = max(len - n_q + qi + 1, 0);
    if (pieces && pgk_paged_piece(table, t_sb, lens, l_s, b, (int)gridDim.z, len, cap)) {
      if (splits == 1) return;
      hi = 0;
    }
    pgk_dec_share(0, hi, split, splits, PGK_TK, start, end);
  }
  if (start >= end) {
    if (splits == 1) return pgk_dec_zero(o, o_sh);
    for (int g = tid; g < PGK_G; g += PGK_DT) {
      ml_part[(part + (long long)g * splits) * 2] = -PGK_INF;
      ml_part[(part + (long long)g * splits) * 2 + 1] = 0.0f;
    }
    return;
  }
  table += b * t_sb;
  const long long head_off = (long long)kvh * block_size * PGK_D;  // kv head in a block
  const long long block_elems = p_sb;  // a block's elements apart (see the header)
  // key -> (table[key / block_size], key % block_size); a block id outside the pool is
  // reported and its keys read as zeros.
  auto rows = [=](int key, int c, long long& k_off, long long& v_off) {
    const int blk = __ldg(table + (key / block_size) * t_sm);
    if (blk < 0 || blk >= n_blocks) {
      if (c == 0) pgk_paged_report(err, tag, blk, n_blocks);
      return false;
    }
    k_off = v_off = blk * block_elems + head_off + (long long)(key % block_size) * PGK_D;
    return true;
  };
  pgk_dec_split_body(q + h0 * q_sh, q_sh, kp, vp, rows, start, end, scale, o_part, ml_part, part,
                     splits, o, o_sh);
}
#endif

// ------------------------------------------------------------------------------------------
// pgk_paged_decode_mma: pgk_attn_decode_mma's tensor-core body (attention_decode.cuh) with
// its keys found through the block table. n_q == 1; PGK_MW warps, each streaming its own
// PGK_MTK-key tiles (warp w takes tiles w, w + PGK_MW, ...) through PGK_MSTAGES private
// cp.async stages with no block barrier in the loop. The products run transposed, S^T =
// K Q^T and O^T += V^T P^T (mma.sync m16n8k16): keys, then head_dim, on the 16 rows, the
// group's query heads on the 8 columns (G <= 16: one or two column blocks), so one block
// reads each K / V byte once for the whole group. Online softmax in fp32 (exp2); the
// warps' (max, sum, O) states merge once at the end, then the block writes out (one split)
// or its partial for pgk_attn_decode_reduce. bf16 / f16 only (the launcher's rule; a
// float build of the family compiles it but never launches it).
//
// A tile's 32 keys span at most 32 blocks of the table: lane l holds the entry of the
// tile's (first block + l), one coalesced load a tile, and each 16-byte chunk takes its
// key's entry by a shuffle. The entries are loaded PGK_MSTAGES tiles ahead of their
// issue, so the cp.async of a tile never waits on its table load. Keys at or past the
// row's length (and keys of a bad block id, reported) are zero-filled, never read: a NaN
// the row does not see never reaches its scores or P V.
#ifndef PGK_QROPE
#define PGK_QROPE 0  // 1: the tensor-core kernels rotate q as they read it (half-split)
#endif
// PGK_PAPPEND 1 (ir op paged_sdpa_append, a decode-only serving step): the tensor-core
// kernel also stores each row's new key (rotated as paged_write rotates it) and value at
// slots[b] of the pool, so the step's paged_write launch goes. new_kv [B, 2 KV, D] (keys,
// then values) rows kn_sb elements apart. Every block of the row's kv head stores the
// same values; a tile holding that slot is patched in shared memory from the block's own
// copy (its cp.async may have read it before or after the store), so no block waits on
// another. Rows are the step's own sequences (no row reads a slot another row stores).
#ifndef PGK_PAPPEND
#define PGK_PAPPEND 0
#endif
#ifndef PGK_PSLOT
#define PGK_PSLOT int  // the slots' type: int or long long (the serving engine's)
#endif
// PGK_KVEARLY 1 (with PGK_PAPPEND, a captured step): a block of one row fills its first
// stages before its programmatic-launch wait (see pgk_paged_decode_mma_row).
#ifndef PGK_KVEARLY
#define PGK_KVEARLY 0
#endif
#if PGK_KVEARLY && !PGK_PAPPEND
#error "PGK_KVEARLY reads the pool early: it comes with PGK_PAPPEND"
#endif
#if PGK_PAPPEND && !PGK_QROPE
#error "PGK_PAPPEND stores rotated keys: it comes with PGK_QROPE"
#endif
// Elements col, col + 1 (col even) of query row x as one register. With PGK_QROPE, rotated
// as pgk_rope rotates them (rope.cuh: half-split pairs (j, j + D/2), float math, one
// rounding) by table rows cs / sn [D / 2] (4-byte aligned: the launcher checks): ir op
// paged_sdpa with rope "half", the serving step's queries.
PGK_DEVICE unsigned pgk_paged_q2(const pgk_t* x, int col, const pgk_t* cs, const pgk_t* sn) {
#if PGK_QROPE
  constexpr int HALF = PGK_D / 2;
  const bool first = col < HALF;
  const int j = first ? col : col - HALF;
  const pgk_vec<pgk_t, 2> a = pgk_load<2>(x + col), p = pgk_load<2>(x + (first ? col + HALF : j));
  const pgk_vec<pgk_t, 2> c = pgk_load<2>(cs + j), s = pgk_load<2>(sn + j);
  pgk_vec<pgk_t, 2> y;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float f = pgk_to_float(a.v[k]), fp = pgk_to_float(p.v[k]);
    const float cf = pgk_to_float(c.v[k]), sf = pgk_to_float(s.v[k]);
    y.v[k] = pgk_from_float<pgk_t>(first ? f * cf - fp * sf : f * cf + fp * sf);
  }
  return *reinterpret_cast<const unsigned*>(&y);
#else
  (void)cs;
  (void)sn;
  return *reinterpret_cast<const unsigned*>(x + col);
#endif
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_paged_decode_mma)
// Row b's attention in pgk_paged_decode_mma (below), which calls it for each row its block
// takes. With pieces, a prompt piece's row is left to pgk_paged_prefill; the kernel's row
// walk passes 0, having sorted its rows already.
PGK_DEVICE void pgk_paged_decode_mma_row(
    int b, const pgk_t* __restrict__ q, const pgk_t* __restrict__ kp, const pgk_t* __restrict__ vp,
    const int* __restrict__ table, const int* __restrict__ lens, float* __restrict__ o_part,
    float* __restrict__ ml_part, pgk_t* __restrict__ o, int n_heads, int group, int kv_heads,
    int block_size, int n_blocks, int max_blocks, long long p_sb, float scale, long long q_sb,
    long long q_sh, long long t_sb, long long t_sm, long long l_s, long long* __restrict__ err,
    long long tag, int pieces, const pgk_t* __restrict__ cs, const pgk_t* __restrict__ sn,
    long long cs_s, const pgk_t* __restrict__ kv_new, long long kn_sb,
    const PGK_PSLOT* __restrict__ slots, long long s_s, int rows, bool early) {
  static_assert(PGK_G <= 16, "one mma tile holds 16 query heads");
  extern __shared__ __align__(16) unsigned char pgk_pdsmem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int qr = lane >> 2, qc = lane & 3;  // fragment row / column-pair of this thread
  const int split = blockIdx.x, splits = gridDim.x;
  const int n_sub = group / PGK_G;
  const int kvh = blockIdx.y / n_sub;
  const int h0 = kvh * group + (blockIdx.y % n_sub) * PGK_G;
  // Head h0's partial slot, indexed by (row, head) as the merge kernel reads them.
  const long long part = ((long long)b * n_heads + h0) * splits + split;
  constexpr long long o_sh = PGK_D;  // out [B, H, 1, D] contiguous
  o += ((long long)b * n_heads + h0) * o_sh;

  // The keys this block reads: [start, end), in PGK_MTK-key tiles dealt over the warps.
  const int cap = max_blocks * block_size;
  const int* __restrict__ trow = table + b * t_sb;
  const long long head_off = (long long)kvh * block_size * PGK_D;  // kv head in a block
  const long long block_elems = p_sb;  // a block's elements apart (see the header)
  int start = 0, end = 0, my_tiles = 0;
  auto set_range = [&](int s, int e) {
    start = s;
    end = e;
    const int n_tiles = e > s ? (e - s + PGK_MTK - 1) / PGK_MTK : 0;
    my_tiles = warp < n_tiles ? (n_tiles - warp + PGK_MW - 1) / PGK_MW : 0;
  };
  pgk_t* wsm = reinterpret_cast<pgk_t*>(pgk_pdsmem) + warp * (PGK_MSTAGES * 2 * PGK_MTILE);
  // The lane's table entry for this warp's it-th tile: block (first key / block_size +
  // lane), if it holds a key of the range (0 otherwise, never used). Through L2 (l2) for
  // the early guess, so that no line it read waits in L1 for the reads after the wait.
  auto entry = [&](int it, bool l2) {
    const int key0 = start + (warp + it * PGK_MW) * PGK_MTK;
    const int blk = key0 / block_size + lane;
    if (it >= my_tiles || blk * block_size >= end) return 0;
    return l2 ? __ldcg(trow + blk * t_sm) : __ldg(trow + blk * t_sm);
  };
  // The warp's it-th tile into its stage; ent: the lane's entry for it (entry(it)). A bad
  // block id is zero-filled, and reported where `report` (not for the early guess).
  auto issue = [&](int it, int ent, bool report) {
    pgk_t* ks = wsm + (it % PGK_MSTAGES) * 2 * PGK_MTILE;
    pgk_t* vs = ks + PGK_MTILE;
    const int key0 = start + (warp + it * PGK_MW) * PGK_MTK;
    const int first = key0 / block_size;
    constexpr int CH = PGK_D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int e = lane; e < PGK_MTK * CH; e += 32) {  // the same trip count in every lane
      const int j = e / CH, cc = (e % CH) * 8, key = key0 + j;
      const int blk = __shfl_sync(0xffffffffu, ent, key / block_size - first);
      bool in = key < end;
      long long off = 0;
      if (in) {
        if (blk < 0 || blk >= n_blocks) {
          if (cc == 0 && report) pgk_paged_report(err, tag, blk, n_blocks);
          in = false;
        } else {
          off = blk * block_elems + head_off + (long long)(key % block_size) * PGK_D + cc;
        }
      }
      pgk_cp_async16(ks + j * PGK_MLD + cc, kp + off, in);
      pgk_cp_async16(vs + j * PGK_MLD + cc, vp + off, in);
    }
  };
  // tab[i]: the entry of the tile issued i issues from now. The first 2 * PGK_MSTAGES
  // entries in one round trip, then one stage per commit group, empty ones too.
  int tab[2 * PGK_MSTAGES];
  auto first_stages = [&](bool l2, bool report) {
#pragma unroll
    for (int i = 0; i < 2 * PGK_MSTAGES; ++i) tab[i] = entry(i, l2);
#pragma unroll
    for (int it = 0; it < PGK_MSTAGES; ++it) {
      if (it < my_tiles) issue(it, tab[it], report);
      pgk_cp_async_commit();
    }
  };
#if PGK_KVEARLY
  // early (a captured step; see pgk_paged_decode_mma): every key of the pool but this
  // step's new one was stored before the graph ran, and the new one is patched into its
  // tile below, so the first stages fill before the wait, over the range and the table
  // entries as read now. Those are a guess until the wait: read again after it, and the
  // stages filled again where anything differs (a warp its own).
  int g_start = 0, g_end = 0;
  int g_tab[PGK_MSTAGES];
  if (early) {
    int s, e;
    pgk_dec_share(0, pgk_paged_clamp(__ldcg(lens + b * l_s), cap), split, splits, PGK_MTK, s, e);
    if (s < e) {
      set_range(s, e);
      first_stages(true, false);
#pragma unroll
      for (int i = 0; i < PGK_MSTAGES; ++i) g_tab[i] = tab[i];
      g_start = s;
      g_end = e;
    }
    pgk_pdl_wait();
    pgk_pdl_trigger();
  }
#else
  (void)early;
#endif

  // Q^T as B fragments (n = heads, zero beyond G; k = head_dim), requested together with
  // the length: one round trip.
  constexpr int KS = PGK_D / 16, NB = (PGK_G + 7) / 8;  // k steps, 8-head column blocks
  unsigned qb[NB][KS][2];
  {
    const pgk_t* q0 = q + b * q_sb + (long long)h0 * q_sh;
    const long long c0 = PGK_QROPE ? b * cs_s : 0;  // row b's tables (one query a row)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int head = nb * 8 + qr, col = ks * 16 + i * 8 + 2 * qc;
          qb[nb][ks][i] = head < PGK_G ? pgk_paged_q2(q0 + head * q_sh, col, cs + c0, sn + c0) : 0u;
        }
  }
#if PGK_PAPPEND
  // This row's new key (rotated) and value for kv head kvh: read now, with q (one round
  // trip), stored at its slot and kept in new_row (for the tile that holds the slot) once
  // the first tiles' loads are in flight, off their critical path. Pair (jr, jr + D/2) a
  // thread, rotated as paged_write rotates it (float math, one rounding).
  constexpr int HALF = PGK_D / 2;
  static_assert(HALF <= PGK_MW * 32, "a pair of the new row a thread");
  __shared__ __align__(16) pgk_t new_row[2][PGK_D];
  const long long slot_in = (long long)__ldg(slots + b * s_s);
  const int nslots = n_blocks * block_size;
  const int jr = min(tid, HALF - 1);
  const pgk_t* krow = kv_new + b * kn_sb + (long long)kvh * PGK_D;
  const pgk_t* vrow = krow + (long long)kv_heads * PGK_D;
  const pgk_t nk0 = krow[jr], nk1 = krow[jr + HALF], nv0 = vrow[jr], nv1 = vrow[jr + HALF];
  const pgk_t nc = cs[b * cs_s + jr], ns = sn[b * cs_s + jr];
  const bool s_ok = slot_in >= 0 && slot_in < nslots;
  const int slot = s_ok ? (int)slot_in : -1;
  auto append_row = [&]() {
    if (slot_in >= nslots && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0)
      pgk_paged_report(err, tag, slot_in, nslots);
    if (s_ok && tid < HALF) {
      const float x0 = pgk_to_float(nk0), x1 = pgk_to_float(nk1);
      const float c = pgk_to_float(nc), sv = pgk_to_float(ns);
      const pgk_t y0 = pgk_from_float<pgk_t>(x0 * c - x1 * sv);
      const pgk_t y1 = pgk_from_float<pgk_t>(x1 * c + x0 * sv);
      new_row[0][jr] = y0;
      new_row[0][jr + HALF] = y1;
      new_row[1][jr] = nv0;
      new_row[1][jr + HALF] = nv1;
      const long long at = (long long)(slot / block_size) * p_sb +
                           (long long)kvh * block_size * PGK_D +
                           (long long)(slot % block_size) * PGK_D;
      pgk_t* kw = const_cast<pgk_t*>(kp) + at;
      pgk_t* vw = const_cast<pgk_t*>(vp) + at;
      kw[jr] = y0;
      kw[jr + HALF] = y1;
      vw[jr] = nv0;
      vw[jr + HALF] = nv1;
    }
    __syncthreads();  // new_row before any tile is patched from it
  };
#else
  (void)kv_new, (void)kn_sb, (void)slots, (void)s_s;
#endif
  int r_start, r_end, row_keys;  // the range as it is now
  {
    int len = pgk_paged_len_checked(lens, l_s, b, cap, err, tag,
                                    tid == 0 && blockIdx.x == 0 && blockIdx.y == 0);
    // A prompt piece's row is pgk_paged_prefill's, launched after this one (and after the
    // merge, which writes the row's zeros): one split writes nothing.
    int hi = len;
    if (pieces && pgk_paged_piece(table, t_sb, lens, l_s, b, rows, len, cap)) {
      if (splits == 1) return;
      hi = 0;
    }
    row_keys = hi;
    pgk_dec_share(0, hi, split, splits, PGK_MTK, r_start, r_end);
  }
#if PGK_KVEARLY
  // The early stages stand where the range and the entries they were issued over are
  // still the row's; else they are drained (each warp its own) and issued again below.
  bool reuse = false;
  if (g_start < g_end) {
    if (g_start == r_start && g_end == r_end) {
#pragma unroll
      for (int i = 0; i < 2 * PGK_MSTAGES; ++i) tab[i] = entry(i, false);
      bool differ = false;
#pragma unroll
      for (int i = 0; i < PGK_MSTAGES; ++i)
        differ |= tab[i] != g_tab[i] || tab[i] < 0 || tab[i] >= n_blocks;
      reuse = !__any_sync(0xffffffffu, differ);
    }
    if (!reuse) {
      pgk_cp_async_wait<0>();
      __syncwarp();
    }
  }
#endif
  set_range(r_start, r_end);
  if (start >= end) {
#if PGK_PAPPEND
    append_row();  // a row with no keys here still stores its new one
#endif
    if (splits == 1) return pgk_dec_zero(o, o_sh);
    for (int g = tid; g < PGK_G; g += blockDim.x) {
      ml_part[(part + (long long)g * splits) * 2] = -PGK_INF;
      ml_part[(part + (long long)g * splits) * 2 + 1] = 0.0f;
    }
    return;
  }

#if PGK_KVEARLY
  if (!reuse) first_stages(false, true);
#else
  first_stages(false, true);
#endif
#pragma unroll
  for (int i = 0; i < PGK_MSTAGES; ++i) tab[i] = tab[i + PGK_MSTAGES];
#if PGK_PAPPEND
  append_row();
  // The key stored at the slot: the row's newest as the engine stores it, found with one
  // table load (-1 where that key is another split's: a row's table names a block once);
  // else (-2) each tile's keys are compared with the slot, lane by lane (a table load a
  // tile, which had cost about 1 us a tile at batch 64 on an H200).
  int patch = -1;
  if (s_ok) {
    const int p = row_keys - 1;
    const int e = p >= 0 ? __ldg(trow + (p / block_size) * t_sm) : -1;
    if (p < 0 || e * block_size + p % block_size != slot)
      patch = -2;
    else if (p >= start && p < end)
      patch = p;
  }
#endif

  // Fragment (r, c) of thread (qr, qc): rows qr, qr + 8; columns 2 qc, 2 qc + 1.
  const float sl2 = scale * 1.4426950408889634f;
  float m_r[NB][2], l_r[NB][2];  // per head 2 qc + h of each column block
  float oacc[PGK_D / 16][NB][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_r[nb][h] = -PGK_INF;
      l_r[nb][h] = 0.0f;
    }
#pragma unroll
    for (int dp = 0; dp < PGK_D / 16; ++dp)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[dp][nb][e] = 0.0f;
  }

  for (int it = 0; it < my_tiles; ++it) {
    pgk_cp_async_wait<PGK_MSTAGES - 1>();  // tile it (groups after it: the stages ahead)
    __syncwarp();
    const pgk_t* ks = wsm + (it % PGK_MSTAGES) * 2 * PGK_MTILE;
    const pgk_t* vs = ks + PGK_MTILE;
    const int key0 = start + (warp + it * PGK_MW) * PGK_MTK;
#if PGK_PAPPEND
    if (patch != -1) {  // the tile's keys stored at this row's slot
      bool hit;
      if (patch >= 0) {
        hit = key0 + lane == patch;
      } else {  // lane l checks key key0 + l
        const int key = key0 + lane,
                  blk = __shfl_sync(0xffffffffu, entry(it, false),
                                    min(key / block_size - key0 / block_size, 31));
        hit = key < end && blk * block_size + key % block_size == slot;
      }
      for (unsigned m = __ballot_sync(0xffffffffu, hit); m; m &= m - 1) {
        const int j = __ffs(m) - 1;
        pgk_t* kr = const_cast<pgk_t*>(ks) + j * PGK_MLD;
        for (int e = lane; e < PGK_D; e += 32) {
          kr[e] = new_row[0][e];
          kr[PGK_MTILE + e] = new_row[1][e];
        }
      }
      __syncwarp();
    }
#endif

    pgk_dec_mma_tile(ks, vs, qb, key0, end, sl2, m_r, l_r, oacc);
    __syncwarp();  // every lane is done with this stage before it is refilled
    if (it + PGK_MSTAGES < my_tiles) issue(it + PGK_MSTAGES, tab[0], true);
    pgk_cp_async_commit();
    // Shift the entries; the one PGK_MSTAGES issues ahead of the next is loaded now.
#pragma unroll
    for (int i = 0; i + 1 < PGK_MSTAGES; ++i) tab[i] = tab[i + 1];
    tab[PGK_MSTAGES - 1] = entry(it + 2 * PGK_MSTAGES, false);
  }
  pgk_dec_mma_end(oacc, m_r, l_r, pgk_pdsmem, splits, part, ml_part, o_part, o, o_sh);
}

// grid (splits, KV * group / PGK_G, Z): block row z takes rows z, z + Z, ... of the rows
// (Z == rows: one each). A launch with prompt pieces and one split may take Z < rows (the
// launcher's decode_rows: the rows that can be decode rows, the step's pieces filling the
// rest): where each row had a block, the 1024-token serving step's 4096 blocks (3840 of
// them finding a piece and leaving) ran six waves beside the piece kernel, with one
// cp.async stage each. Warp 0 tells a block's rows apart 32 at a time, a lane a row, and
// the block attends the decode rows among them one after another.
extern "C" __global__ void __launch_bounds__(PGK_MW * 32)
    pgk_paged_decode_mma(const pgk_t* __restrict__ q, const pgk_t* __restrict__ kp,
                         const pgk_t* __restrict__ vp, const int* __restrict__ table,
                         const int* __restrict__ lens, float* __restrict__ o_part,
                         float* __restrict__ ml_part, pgk_t* __restrict__ o, int n_heads, int group,
                         int kv_heads, int block_size, int n_blocks, int max_blocks, long long p_sb,
                         float scale, long long q_sb, long long q_sh, long long t_sb,
                         long long t_sm, long long l_s, long long* __restrict__ err, long long tag,
                         int pieces, const pgk_t* __restrict__ cs, const pgk_t* __restrict__ sn,
                         long long cs_s, const pgk_t* __restrict__ kv_new, long long kn_sb,
                         const PGK_PSLOT* __restrict__ slots, long long s_s, int rows) {
  const int z = (int)blockIdx.z, nz = (int)gridDim.z;
  const bool one = nz >= rows;  // a row a block, which its body tests for a piece
  // PGK_KVEARLY: a block of one row waits in its body, once its first stages are in
  // flight.
  const bool row_early = PGK_KVEARLY && one;
  if (!row_early) {
    pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
    pgk_pdl_trigger();
  }
  __shared__ unsigned s_need[2];  // this round's rows to attend, and its rows of no keys
  const int lane = threadIdx.x & 31, cap = max_blocks * block_size;
  for (int base = 0; z + base * nz < rows; base += 32) {
    unsigned need = 1u;
    if (!one) {
      __syncthreads();  // every thread has read s_need
      if (threadIdx.x < 32) {
        const int r = z + (base + lane) * nz;
        bool dec = false, empty = false;
        if (r < rows) {
          // A bad length is reported for every row, pieces' too.
          const int len = pgk_paged_len_checked(lens, l_s, r, cap, err, tag,
                                                blockIdx.x == 0 && blockIdx.y == 0);
          empty = len == 0;  // padding: zeros, with no load of q
          dec = !empty && !(pieces && pgk_paged_piece(table, t_sb, lens, l_s, r, rows, len, cap));
        }
        const unsigned m = __ballot_sync(0xffffffffu, dec), m0 = __ballot_sync(0xffffffffu, empty);
        if (lane == 0) s_need[0] = m, s_need[1] = m0;
      }
      __syncthreads();
      need = s_need[0];
      const int h0 =
          (int)(blockIdx.y / (group / PGK_G)) * group + (int)(blockIdx.y % (group / PGK_G)) * PGK_G;
      for (unsigned m = s_need[1]; m; m &= m - 1)
        pgk_dec_zero(o + ((long long)(z + (base + __ffs(m) - 1) * nz) * n_heads + h0) * PGK_D,
                     PGK_D);
    }
    for (unsigned m = need; m; m &= m - 1) {
      if (!one) __syncthreads();  // the last row's shared memory is read
      pgk_paged_decode_mma_row(z + (base + __ffs(m) - 1) * nz, q, kp, vp, table, lens, o_part,
                               ml_part, o, n_heads, group, kv_heads, block_size, n_blocks,
                               max_blocks, p_sb, scale, q_sb, q_sh, t_sb, t_sm, l_s, err, tag,
                               one ? pieces : 0, cs, sn, cs_s, kv_new, kn_sb, slots, s_s, rows,
                               row_early);
    }
  }
}
#endif
