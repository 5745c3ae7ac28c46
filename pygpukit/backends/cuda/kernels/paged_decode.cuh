// Paged decode attention: the split-K decode kernel of attention_decode.cuh reading its
// keys and values through per-row block tables (the serving engine's paged KV cache).
//
// pools k/v [n_blocks, KV, block_size, D] contiguous; table [B, max_blocks] and lens [B]
// int32 (element strides t_sb, t_sm, l_s); q [B, H, n_q, D] (strides q_sb, q_sh, q_st; D
// contiguous); out [B, H, n_q, D] contiguous. Query qi of row b sits at position
// lens[b] - n_q + qi and sees keys [0, position]; a query that sees none gets zeros.
// grid (splits, KV * group / PGK_G, B * n_q), PGK_DT threads: one block serves PGK_G query
// heads of one kv head (the whole GQA group up to 16), so each K/V byte of its share is
// read once. Tiles, scores, online softmax and P.V are pgk_attn_decode_split's. With one
// split the block normalises and writes out; with several (n_q == 1 only) each writes its
// partial and (max, sum) pair and pgk_attn_decode_reduce (attention_decode.cuh, launched
// after it with the same defines) merges them. A length outside [0, max_blocks *
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

extern "C" __global__ void __launch_bounds__(PGK_DT)
    pgk_paged_decode(const pgk_t* __restrict__ q, const pgk_t* __restrict__ kp,
                     const pgk_t* __restrict__ vp, const int* __restrict__ table,
                     const int* __restrict__ lens, float* __restrict__ o_part,
                     float* __restrict__ ml_part, pgk_t* __restrict__ o, int n_heads,
                     int group, int n_q, int kv_heads, int block_size, int n_blocks,
                     int max_blocks, float scale, long long q_sb, long long q_sh,
                     long long q_st, long long t_sb, long long t_sm, long long l_s,
                     long long* __restrict__ err, long long tag) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* qs = reinterpret_cast<float*>(smem_raw);
  float* S = qs + PGK_G * PGK_D;
  float* alpha_s = S + PGK_G * PGK_TK;
  pgk_t* stages = reinterpret_cast<pgk_t*>(
      smem_raw + ((PGK_G * PGK_D + PGK_G * PGK_TK + PGK_G) * 4 + 15) / 16 * 16);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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
    // The query's position is len - n_q + qi: it sees keys [0, that + 1).
    const int hi = max(len - n_q + qi + 1, 0);
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
  const int n_tiles = (end - start + PGK_TK - 1) / PGK_TK;
  table += b * t_sb;
  const long long head_off = (long long)kvh * block_size * PGK_D;  // kv head in a block
  const long long block_elems = (long long)kv_heads * block_size * PGK_D;

  // A tile's keys are read through the block table: key -> (table[key / block_size],
  // key % block_size). A block id outside the pool is reported and its keys read as zeros.
  auto issue = [&](int t) {
    pgk_t* ks = stages + (t % PGK_STAGES) * PGK_STAGE_ELEMS;
    pgk_t* vs = ks + PGK_TK * PGK_KLD;
    const int key0 = start + t * PGK_TK;
    constexpr int CH = PGK_D / PGK_VEC;  // 16-byte chunks per row
    for (int e = tid; e < PGK_TK * CH; e += PGK_DT) {
      const int j = e / CH, c = (e % CH) * PGK_VEC;
      const int key = key0 + j;
      bool in = key < end;
      long long row = 0;
      if (in) {
        const int blk = __ldg(table + (key / block_size) * t_sm);
        if (blk < 0 || blk >= n_blocks) {
          if (c == 0) pgk_paged_report(err, tag, blk, n_blocks);
          in = false;
        } else {
          row = blk * block_elems + head_off + (long long)(key % block_size) * PGK_D;
        }
      }
      pgk_cp_async16(ks + j * PGK_KLD + c, kp + row + c, in);
      pgk_cp_async16(vs + j * PGK_D + c, vp + row + c, in);
    }
  };
#pragma unroll
  for (int t = 0; t < PGK_STAGES - 1; ++t) {
    if (t < n_tiles) issue(t);
    pgk_cp_async_commit();
  }

  // log2(e) folded into q so the softmax runs on exp2.
  const float qscale = scale * 1.4426950408889634f;
  for (int e = tid; e < PGK_G * PGK_D; e += PGK_DT) {
    const int g = e / PGK_D, d = e % PGK_D;
    qs[e] = pgk_to_float(q[(h0 + g) * q_sh + d]) * qscale;
  }

  float m_r[PGK_HPW], l_r[PGK_HPW];
#pragma unroll
  for (int i = 0; i < PGK_HPW; ++i) {
    m_r[i] = -PGK_INF;
    l_r[i] = 0.0f;
  }
  constexpr int V = PGK_VEC;
  const int st = tid / PGK_LPR, dl = (tid % PGK_LPR) * V;
  float acc[PGK_G][V];
#pragma unroll
  for (int g = 0; g < PGK_G; ++g)
#pragma unroll
    for (int c = 0; c < V; ++c) acc[g][c] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    if (t + PGK_STAGES - 1 < n_tiles) issue(t + PGK_STAGES - 1);
    pgk_cp_async_commit();
    pgk_cp_async_wait<PGK_STAGES - 1>();
    __syncthreads();
    const pgk_t* ks = stages + (t % PGK_STAGES) * PGK_STAGE_ELEMS;
    const pgk_t* vs = ks + PGK_TK * PGK_KLD;
    const int key0 = start + t * PGK_TK;

    {  // scores: thread -> (key j, heads hg, hg + 4, ...)
      const int j = tid & (PGK_TK - 1), hg = tid >> 6;
      constexpr int NH = (PGK_G + 3) / 4;
      float s[NH];
#pragma unroll
      for (int i = 0; i < NH; ++i) s[i] = 0.0f;
      const pgk_t* kr = ks + j * PGK_KLD;
#pragma unroll 4
      for (int d = 0; d < PGK_D; d += V) {
        const auto kv = pgk_load<V>(kr + d);
        float kf[V];
#pragma unroll
        for (int c = 0; c < V; ++c) kf[c] = pgk_to_float(kv.v[c]);
#pragma unroll
        for (int i = 0; i < NH; ++i) {
          const int g = hg + 4 * i;
          if (g < PGK_G) {
            const float* qr = qs + g * PGK_D + d;
#pragma unroll
            for (int c = 0; c < V; c += 4) {
              const float4 qv = *reinterpret_cast<const float4*>(qr + c);
              s[i] += qv.x * kf[c] + qv.y * kf[c + 1] + qv.z * kf[c + 2] + qv.w * kf[c + 3];
            }
          }
        }
      }
      const bool valid = key0 + j < end;
#pragma unroll
      for (int i = 0; i < NH; ++i) {
        const int g = hg + 4 * i;
        if (g < PGK_G) S[g * PGK_TK + j] = valid ? s[i] : -PGK_INF;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < PGK_HPW; ++i) {  // softmax: warp -> heads warp, warp + 8
      const int g = warp + 8 * i;
      if (g < PGK_G) {
        const float s0 = S[g * PGK_TK + lane], s1 = S[g * PGK_TK + lane + 32];
        const float mn = max(m_r[i], pgk_warp_max(max(s0, s1)));  // finite: key0 < end
        const float p0 = exp2f(s0 - mn), p1 = exp2f(s1 - mn);
        const float al = exp2f(m_r[i] - mn);
        l_r[i] = l_r[i] * al + pgk_warp_sum(p0 + p1);
        m_r[i] = mn;
        S[g * PGK_TK + lane] = p0;
        S[g * PGK_TK + lane + 32] = p1;
        if (lane == 0) alpha_s[g] = al;
      }
    }
    __syncthreads();
    {  // P.V: thread -> (key stream st, columns dl .. dl + V)
#pragma unroll
      for (int g = 0; g < PGK_G; ++g) {
        const float al = alpha_s[g];
#pragma unroll
        for (int c = 0; c < V; ++c) acc[g][c] *= al;
      }
#pragma unroll 2
      for (int j = st; j < PGK_TK; j += PGK_STREAMS) {
        const auto vv = pgk_load<V>(vs + j * PGK_D + dl);
        float vf[V];
#pragma unroll
        for (int c = 0; c < V; ++c) vf[c] = pgk_to_float(vv.v[c]);
#pragma unroll
        for (int g = 0; g < PGK_G; ++g) {
          const float p = S[g * PGK_TK + j];
#pragma unroll
          for (int c = 0; c < V; ++c) acc[g][c] += p * vf[c];
        }
      }
    }
    __syncthreads();  // stage t % STAGES and S are rewritten next iteration
  }
  pgk_cp_async_wait<0>();
  __syncthreads();

  // Sum the key streams through shared memory (the stage buffers are free now).
  float* red = reinterpret_cast<float*>(stages);
#pragma unroll
  for (int g = 0; g < PGK_G; ++g)
#pragma unroll
    for (int c = 0; c < V; ++c) red[(st * PGK_G + g) * PGK_D + dl + c] = acc[g][c];
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < PGK_HPW; ++i) {
      const int g = warp + 8 * i;
      if (g < PGK_G) {
        alpha_s[g] = l_r[i];  // the sum, for the one-split normalisation below
        if (splits > 1) {
          ml_part[(part + (long long)g * splits) * 2] = m_r[i];
          ml_part[(part + (long long)g * splits) * 2 + 1] = l_r[i];
        }
      }
    }
  }
  __syncthreads();
  for (int e = tid; e < PGK_G * PGK_D; e += PGK_DT) {
    float sum = 0.0f;
#pragma unroll 4
    for (int s2 = 0; s2 < PGK_STREAMS; ++s2) sum += red[s2 * PGK_G * PGK_D + e];
    const int g = e / PGK_D, d = e % PGK_D;
    if (splits == 1)  // a non-empty block's sum is positive
      o[g * o_sh + d] = pgk_from_float<pgk_t>(sum / alpha_s[g]);
    else
      o_part[(part + (long long)g * splits) * PGK_D + d] = sum;
  }
}

