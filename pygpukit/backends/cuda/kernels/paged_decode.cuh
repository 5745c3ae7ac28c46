// Paged decode attention: the split-K decode kernel of attention_decode.cuh reading its
// keys and values through per-row block tables (the serving engine's paged KV cache).
//
// pools k/v [n_blocks, KV, block_size, D] contiguous; table [B, max_blocks] and lens [B]
// int32 (element strides t_sb, t_sm, l_s); q [B, H, n_q, D] (strides q_sb, q_sh, q_st; D
// contiguous); out [B, H, n_q, D] contiguous. Query qi of row b sits at position
// lens[b] - n_q + qi and sees keys [0, position]; a query that sees none gets zeros.
// grid (splits, KV * group / PGK_G, B * n_q), PGK_DT threads: one block serves PGK_G query
// heads of one kv head (the whole GQA group up to 16), so each K/V byte of its share is
// read once. Tiles, scores, online softmax and P.V are pgk_dec_split_body's, shared with
// pgk_attn_decode_split: only the key -> row lookup (through the block table) differs.
// With pieces set (one query a row, launched with pgk_paged_prefill after it), the rows
// of prompt pieces (pgk_paged_piece) are left to that kernel.
// With one split the block normalises and writes out; with several (n_q == 1 only) each
// writes its partial and (max, sum) pair and pgk_attn_decode_reduce (attention_decode.cuh,
// launched after it with the same defines) merges them. A length outside [0, max_blocks *
// block_size] or a block id outside the pool goes to the error word (IndexError at the
// next synchronisation); the kernel clamps or skips it rather than read outside the pool.
#include "attention_decode.cuh"

PGK_DEVICE void pgk_paged_report(long long* err, long long tag, long long value,
                                 long long limit) {
  if (err && atomicCAS(reinterpret_cast<unsigned long long*>(err), 0ull, PGK_ERR_INDEX) == 0ull) {
    err[1] = tag;
    err[2] = value;
    err[3] = limit;
  }
}

// Row b's length, clamped to the table's keys [0, cap] (pgk_paged_decode reports a bad one).
PGK_DEVICE int pgk_paged_len(const int* __restrict__ lens, long long l_s, int b, int cap) {
  const int len = __ldg(lens + b * l_s);
  return len < 0 ? 0 : (len > cap ? cap : len);
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
                     float* __restrict__ ml_part, pgk_t* __restrict__ o, int n_heads,
                     int group, int n_q, int kv_heads, int block_size, int n_blocks,
                     int max_blocks, float scale, long long q_sb, long long q_sh,
                     long long q_st, long long t_sb, long long t_sm, long long l_s,
                     long long* __restrict__ err, long long tag, int pieces) {
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
    int len = __ldg(lens + b * l_s);
    if (len < 0 || len > cap) {
      if (tid == 0 && blockIdx.x == 0 && blockIdx.y == 0) pgk_paged_report(err, tag, len, cap);
      len = len < 0 ? 0 : cap;
    }
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
  const long long block_elems = (long long)kv_heads * block_size * PGK_D;
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
  pgk_dec_split_body(q + h0 * q_sh, q_sh, kp, vp, rows, start, end, scale, o_part, ml_part,
                     part, splits, o, o_sh);
}
#endif
