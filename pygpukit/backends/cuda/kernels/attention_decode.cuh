// Decode attention: one query token per (batch, head) against a KV cache, split-K.
//
// q: [B, H, D] (batch/head strides); K/V caches: [B, KVH, S_max, D] (batch/head/seq strides,
// D contiguous); o: [B, H, D] (batch/head strides). The live context length is READ FROM
// DEVICE MEMORY (ctx_len, int32; null = the whole cache), so one captured CUDA graph serves
// every decode step, and so is the optional per-batch start (kv_start[b * kvs_stride], left
// padding): batch b sees keys [kv_start[b], ctx_len) and each of the `splits` blocks of a kv
// head takes an equal share of that range, computed on device, so a large cache with a short
// live context costs only the live keys. (An int64 scalar is read through its low word.)
//
// With one split the block normalises and writes o itself: one kernel, no workspace. With
// several, each block writes its unnormalised partial output and (max, sum) pair to a float
// workspace, merged either by the block that arrives last (given counters: one kernel)
// or by pgk_attn_decode_reduce launched after it. Last-block merge: each block counts itself
// in on a per-(batch, kv-head block row) counter after a fence; the last one merges every
// split's partial (pgk_dec_arrive / pgk_dec_merge). The counter wraps back to 0 in that same
// atomic, so the next launch or graph replay finds it zeroed: the caller zeroes it once, and
// two launches may share it only if one completes before the other counts (true for
// consecutive launches on a stream: each waits on griddepcontrol before it counts).
//
// pgk_attn_decode_split (CUDA cores, f32 too), grid (splits, KVH * group / PGK_G, B), 256
// threads: one block serves PGK_G query heads of its kv head (all of them when group = H /
// KVH <= 16), so each K/V byte is read from memory once.
// 64-key tiles stream through PGK_STAGES shared-memory stages by cp.async, keeping
// (PGK_STAGES - 1) tiles in flight while the current one is used. Scores: four threads per
// key, each a quarter of the heads; softmax: one warp per head (online, exp2); P.V: 16-byte
// V vectors per thread, all heads at once, fp32 accumulators.
#include "common.cuh"

#ifndef PGK_ERR_INDEX
#define PGK_ERR_INDEX 1  // the error word's code for a bad index (codegen/prelude.py)
#endif
#ifndef PGK_ERR_KV_LEN
#define PGK_ERR_KV_LEN 3  // a bad kv_len; kv_start's code is one more (codegen/prelude.py)
#endif

#ifndef PGK_DEC_PF
#define PGK_DEC_PF 256  // positions prefetched before the wait (one split)
#endif


#ifndef PGK_D
#define PGK_D 128
#endif
#ifndef PGK_G
#define PGK_G 8
#endif
#ifndef PGK_STAGES
#define PGK_STAGES 4
#endif
#define PGK_DT 256                                   // threads per block
#define PGK_TK 64                                    // keys per tile
#define PGK_KPAD (16 / (int)sizeof(pgk_t))           // K rows padded by 16 bytes
#define PGK_KLD (PGK_D + PGK_KPAD)
#define PGK_STAGE_ELEMS (PGK_TK * (PGK_KLD + PGK_D))
#define PGK_LPR (PGK_D / PGK_VEC)                    // threads per V row in P.V
#define PGK_STREAMS (PGK_DT / PGK_LPR)               // key streams in P.V
#define PGK_HPW ((PGK_G + 7) / 8)                    // heads per warp in the softmax

static_assert(PGK_VEC * (int)sizeof(pgk_t) == 16, "decode attention needs 16-byte vectors");
static_assert(PGK_D % 32 == 0, "head_dim must be a multiple of 32");

// Dynamic shared memory (sized by the Python launcher, which mirrors this layout):
//   qs [G][D] f32 | S [G][TK] f32 | alpha [G] f32 | pad to 16 | stages, reused at the end
//   for the [STREAMS][G][D] f32 reduction buffer.

// [lo, hi): the keys batch b sees (the live length and start as read), clamped to the
// cache; then this split's share of it, in whole `tile`-key tiles (trailing splits may get
// nothing).
PGK_DEVICE void pgk_dec_bounds(int len_raw, int start_raw, int max_seq, int& lo, int& hi) {
  hi = min(max(len_raw, 0), max_seq);
  lo = min(max(start_raw, 0), hi);
}
// The op's rule is a live length and start in [0, max_seq]: one outside it is recorded in
// the error word (err may be null: no report), raised by the backend at its next sync, while
// pgk_dec_bounds still clamps it so nothing is read out of bounds. Thread 0 of each batch
// row's first block checks the values it read (the others read the same ones).
PGK_DEVICE void pgk_dec_check(int len_raw, int start_raw, int max_seq, long long* err,
                              long long tag) {
  if (threadIdx.x || blockIdx.x || blockIdx.y || !err) return;
  const bool len_bad = len_raw < 0 || len_raw > max_seq;
  if ((len_bad || start_raw < 0 || start_raw > max_seq) &&
      atomicCAS(reinterpret_cast<unsigned long long*>(err), 0ull,
                len_bad ? PGK_ERR_KV_LEN : PGK_ERR_KV_LEN + 1) == 0ull) {
    err[1] = tag;
    err[2] = len_bad ? len_raw : start_raw;
    err[3] = max_seq;
  }
}
PGK_DEVICE void pgk_dec_share(int lo, int hi, int split, int splits, int tile, int& start,
                              int& end) {
  const int per = ((hi - lo + splits - 1) / splits + tile - 1) / tile * tile;
  start = lo + split * per;
  end = min(start + per, hi);
}
PGK_DEVICE void pgk_dec_range(const int* ctx_len, const int* kv_start, long long kvs_stride,
                              int max_seq, int b, int split, int splits, int tile, int& start,
                              int& end, long long* err, long long tag) {
  int lo, hi;
  const int start_raw = kv_start ? __ldcg(kv_start + b * kvs_stride) : 0;
  const int len_raw = pgk_read_i32(ctx_len, max_seq);
  pgk_dec_check(len_raw, start_raw, max_seq, err, tag);
  pgk_dec_bounds(len_raw, start_raw, max_seq, lo, hi);
  pgk_dec_share(lo, hi, split, splits, tile, start, end);
}

// Every thread calls it after writing its share of the block's partial: true in the block
// that arrives last at `counter` (all splits' partials are then visible to it). atomicInc
// wraps to 0 at splits - 1, so the last arrival also leaves the counter zeroed.
PGK_DEVICE bool pgk_dec_arrive(unsigned* counter, int splits) {
  __shared__ bool last;
  __threadfence();  // this thread's partial reaches L2 before the block is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicInc(counter, (unsigned)(splits - 1)) == (unsigned)(splits - 1);
    __threadfence();  // acquire: the reads below see every other block's partial
  }
  __syncthreads();
  return last;
}

#ifndef PGK_MP
#define PGK_MP 8  // splits whose partials are in flight at once in the merge
#endif

// The last block's merge of `splits` partials of this block's PGK_G heads (head g of split s
// at o_part[(g * splits + s) * D] and ml_part[(g * splits + s) * 2]) into o (head 0's row,
// heads o_sh apart). NT threads; smem (free by now, sized by the launcher):
//   ring [PGK_MP][NC][NT] float4 | w [G][splits] | l [G][splits] | L [G].
// Each thread owns fixed 16-byte columns and streams them split by split through its own
// ring slots by cp.async, PGK_MP splits in flight, so that loop needs no block barrier; the
// (max, sum) pairs are read meanwhile and turned into per-split weights. (An online merge,
// each thread carrying its heads' records through the ring, measured slower: half the
// splits in flight for the same ring.)
template <int NT>
PGK_DEVICE void pgk_dec_merge(const float* __restrict__ o_part, const float* __restrict__ ml_part,
                              pgk_t* __restrict__ o, long long o_sh, int splits,
                              unsigned char* smem) {
  constexpr int CPH = PGK_D / 4;          // float4 columns per head
  constexpr int C = PGK_G * CPH;          // float4 columns of the block's heads
  constexpr int NC = (C + NT - 1) / NT;   // columns per thread
  float4* ring = reinterpret_cast<float4*>(smem);
  float* wsh = reinterpret_cast<float*>(ring + PGK_MP * NC * NT);
  float* lsh = wsh + PGK_G * splits;
  float* tot = lsh + PGK_G * splits;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const float4* src = reinterpret_cast<const float4*>(o_part);
  auto issue = [&](int s) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int c = min(t + i * NT, C - 1);
      pgk_cp_async16(ring + ((s % PGK_MP) * NC + i) * NT + t,
                     src + ((long long)(c / CPH) * splits + s) * CPH + c % CPH, t + i * NT < C);
    }
  };
#pragma unroll
  for (int s = 0; s < PGK_MP - 1; ++s) {
    if (s < splits) issue(s);
    pgk_cp_async_commit();
  }
  const float2* ml2 = reinterpret_cast<const float2*>(ml_part);
#pragma unroll 4
  for (int e = t; e < PGK_G * splits; e += NT) {
    const float2 v = __ldcg(ml2 + e);
    wsh[e] = v.x;
    lsh[e] = v.y;
  }
  __syncthreads();
  for (int g = warp; g < PGK_G; g += NT / 32) {  // (max, sum) -> weights, warp per head
    float mx = -PGK_INF;
    for (int s = lane; s < splits; s += 32) mx = max(mx, wsh[g * splits + s]);
    mx = pgk_warp_max(mx);
    float l = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      const float m = wsh[g * splits + s];
      // An empty split (-inf, 0) weighs 0; so does everything when all are empty. A split
      // whose scores were all NaN also has max -inf (fmaxf skips NaN) but a NaN sum: it
      // keeps its weight, so the NaN reaches the total.
      const float w = (m == -PGK_INF && lsh[g * splits + s] == 0.0f) ? 0.0f : exp2f(m - mx);
      wsh[g * splits + s] = w;
      l += w * lsh[g * splits + s];
    }
    l = pgk_warp_sum(l);
    if (lane == 0) tot[g] = l;
  }
  __syncthreads();
  float4 acc[NC];
#pragma unroll
  for (int i = 0; i < NC; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s = 0; s < splits; ++s) {
    if (s + PGK_MP - 1 < splits) issue(s + PGK_MP - 1);
    pgk_cp_async_commit();
    pgk_cp_async_wait<PGK_MP - 1>();  // split s has landed (this thread's columns only)
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int c = t + i * NT;
      const float w = c < C ? wsh[(c / CPH) * splits + s] : 0.0f;
      if (w != 0.0f) {  // an empty split never wrote its o_part
        const float4 v = ring[((s % PGK_MP) * NC + i) * NT + t];
        acc[i].x += w * v.x;
        acc[i].y += w * v.y;
        acc[i].z += w * v.z;
        acc[i].w += w * v.w;
      }
    }
    __syncwarp();  // this slot is refilled by the next iteration's issue
  }
  pgk_cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < NC; ++i) {
    const int c = t + i * NT;
    if (c < C) {
      const int g = c / CPH, d = (c % CPH) * 4;
      // ctx_len == 0 (or kv_start >= ctx_len) leaves every split empty: zeros; a NaN total
      // (NaN or inf in a visible q, k or v) stays NaN.
      const float inv = tot[g] == 0.0f ? 0.0f : 1.0f / tot[g];
      pgk_t* orow = o + g * o_sh + d;
      orow[0] = pgk_from_float<pgk_t>(acc[i].x * inv);
      orow[1] = pgk_from_float<pgk_t>(acc[i].y * inv);
      orow[2] = pgk_from_float<pgk_t>(acc[i].z * inv);
      orow[3] = pgk_from_float<pgk_t>(acc[i].w * inv);
    }
  }
}

// Zeros for a block's heads when it is the only split and sees no key.
PGK_DEVICE void pgk_dec_zero(pgk_t* o, long long o_sh) {
  for (int e = threadIdx.x; e < PGK_G * PGK_D; e += blockDim.x)
    o[(e / PGK_D) * o_sh + e % PGK_D] = pgk_from_float<pgk_t>(0.0f);
}

// The split kernels' body (pgk_attn_decode_split here, pgk_paged_decode in
// paged_decode.cuh): one block's keys [start, end) of one kv head against its PGK_G query
// heads. q: head h0's row (heads q_sh apart); kc / vc: the kv head's cache, a key's rows
// found by `rows` (the only difference between the contiguous and the paged cache); o:
// head h0's output row (heads o_sh apart), or with several splits the partials at `part`.
// Called by every thread of the block with start < end.
template <typename Rows>
PGK_DEVICE void pgk_dec_split_body(const pgk_t* __restrict__ q, long long q_sh,
                                   const pgk_t* __restrict__ kc, const pgk_t* __restrict__ vc,
                                   Rows rows, int start, int end, float scale,
                                   float* __restrict__ o_part, float* __restrict__ ml_part,
                                   long long part, int splits, pgk_t* __restrict__ o,
                                   long long o_sh) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* qs = reinterpret_cast<float*>(smem_raw);
  float* S = qs + PGK_G * PGK_D;
  float* alpha_s = S + PGK_G * PGK_TK;
  pgk_t* stages = reinterpret_cast<pgk_t*>(
      smem_raw + ((PGK_G * PGK_D + PGK_G * PGK_TK + PGK_G) * 4 + 15) / 16 * 16);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_tiles = (end - start + PGK_TK - 1) / PGK_TK;

  // A key's K and V rows (element offsets from kc / vc) come from rows(key, c, k_off,
  // v_off); false: the key reads as zeros (c: the 16-byte chunk asking, so a caller that
  // reports a bad key does it once a row).
  auto issue = [&](int t) {
    pgk_t* ks = stages + (t % PGK_STAGES) * PGK_STAGE_ELEMS;
    pgk_t* vs = ks + PGK_TK * PGK_KLD;
    const int key0 = start + t * PGK_TK;
    constexpr int CH = PGK_D / PGK_VEC;  // 16-byte chunks per row
    for (int e = tid; e < PGK_TK * CH; e += PGK_DT) {
      const int j = e / CH, c = (e % CH) * PGK_VEC;
      long long k_off = 0, v_off = 0;
      const bool in = key0 + j < end && rows(key0 + j, c, k_off, v_off);
      pgk_cp_async16(ks + j * PGK_KLD + c, kc + k_off + c, in);
      pgk_cp_async16(vs + j * PGK_D + c, vc + v_off + c, in);
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
    qs[e] = pgk_to_float(q[g * q_sh + d]) * qscale;
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

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_attn_decode_split)
extern "C" __global__ void __launch_bounds__(PGK_DT)
    pgk_attn_decode_split(const pgk_t* __restrict__ q, const pgk_t* __restrict__ kc,
                          const pgk_t* __restrict__ vc, const int* __restrict__ ctx_len,
                          float* __restrict__ o_part, float* __restrict__ ml_part,
                          int n_heads, int group, float scale, long long q_sb,
                          long long q_sh, long long k_sb, long long k_sh, long long k_ss,
                          long long v_sb, long long v_sh, long long v_ss,
                          const int* __restrict__ kv_start, long long kvs_stride,
                          int max_seq, pgk_t* __restrict__ o, long long o_sb, long long o_sh,
                          unsigned* __restrict__ counters, long long* __restrict__ err,
                          long long tag) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x;
  const int split = blockIdx.x, splits = gridDim.x;
  // grid.y = kv heads x (group / PGK_G): a group larger than PGK_G (multi-query
  // attention) is served in PGK_G-head slices, each reading the kv head once.
  const int n_sub = group / PGK_G;
  const int kvh = blockIdx.y / n_sub, b = blockIdx.z;
  const int h0 = kvh * group + (blockIdx.y % n_sub) * PGK_G;
  const long long part = ((long long)b * n_heads + h0) * splits + split;  // head h0's slot
  const long long head0 = ((long long)b * n_heads + h0) * splits;         // its split 0
  o += b * o_sb + h0 * o_sh;
  unsigned* counter = counters + b * gridDim.y + blockIdx.y;

  int start, end;
  pgk_dec_range(ctx_len, kv_start, kvs_stride, max_seq, b, split, splits, PGK_TK, start, end,
                err, tag);
  if (start >= end) {
    if (splits == 1) return pgk_dec_zero(o, o_sh);
    for (int g = tid; g < PGK_G; g += PGK_DT) {
      ml_part[(part + (long long)g * splits) * 2] = -PGK_INF;
      ml_part[(part + (long long)g * splits) * 2 + 1] = 0.0f;
    }
    if (counters && pgk_dec_arrive(counter, splits))
      pgk_dec_merge<PGK_DT>(o_part + head0 * PGK_D, ml_part + head0 * 2, o, o_sh, splits,
                            smem_raw);
    return;
  }
  kc += b * k_sb + kvh * k_sh;
  vc += b * v_sb + kvh * v_sh;
  auto rows = [=](int key, int, long long& k_off, long long& v_off) {
    k_off = key * k_ss;
    v_off = key * v_ss;
    return true;
  };
  pgk_dec_split_body(q + b * q_sb + h0 * q_sh, q_sh, kc, vc, rows, start, end, scale, o_part,
                     ml_part, part, splits, o, o_sh);
  if (counters && splits > 1 && pgk_dec_arrive(counter, splits))
    pgk_dec_merge<PGK_DT>(o_part + head0 * PGK_D, ml_part + head0 * 2, o, o_sh, splits,
                          smem_raw);
}
#endif

// The merge as its own kernel (the split kernels launched without counters), grid (H, B),
// PGK_RT threads: the alternative to the last block's merge, spread over H blocks instead of
// one per kv head. Every load is issued before its first use: the (max, sum) pairs of up
// to PGK_RT splits together with the first round of partial outputs (float4 columns,
// PGK_RT / (D / 4) split groups each taking every group-th split, PGK_RUNROLL loads in
// flight), summed across groups in shared memory. A loop that waited on each split's load
// in turn cost ~4 us of L2 latency at 33 splits. Measured on an H200 against the
// last-block merge, this kernel is faster at every split count tried (see
// docs/kernels.md): the last block's fence, atomic and single-SM read of every
// partial cost more than a second launch that PDL already overlaps.
#define PGK_MAXSPLITS 256
#define PGK_RT 256
#define PGK_RUNROLL 8
#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_attn_decode_reduce)
extern "C" __global__ void __launch_bounds__(PGK_RT)
    pgk_attn_decode_reduce(const float* __restrict__ o_part, const float* __restrict__ ml_part,
                           pgk_t* __restrict__ o, int n_heads, int splits, long long o_sb,
                           long long o_sh) {
  // Triggered before the wait: the next kernel's blocks may then take the SMs the split
  // blocks leave and start their early loads (kv_early, gemv w_early) while this merge
  // still waits; they read nothing this launch or its split kernel writes before their own
  // wait, which returns only once this kernel (so also the split kernel) is complete.
  pgk_pdl_trigger();
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  constexpr int C4 = PGK_D / 4, SG = PGK_RT / C4;  // float4 columns, split groups
  __shared__ float wsh[PGK_MAXSPLITS];
  __shared__ float scratch[32];
  __shared__ float4 part[SG][C4];
  const int h = blockIdx.x, b = blockIdx.y, t = threadIdx.x;
  const long long base = ((long long)b * n_heads + h) * splits;
  const int c4 = t % C4, sg = t / C4;
  const float4* op = reinterpret_cast<const float4*>(o_part + base * PGK_D) + c4;
  // One round of partials: splits s0, s0 + SG, ... (PGK_RUNROLL of them) of this thread.
  auto load_round = [&](int s0, float4* v) {
#pragma unroll
    for (int u = 0; u < PGK_RUNROLL; ++u) {
      const int s = s0 + u * SG;
      v[u] = s < splits ? __ldcg(op + (long long)s * C4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  // The first round's partials are requested with the (max, sum) pairs: one round trip.
  float4 v[PGK_RUNROLL];
  load_round(sg, v);
  float2 ml = make_float2(-PGK_INF, 0.0f);
  if (t < splits) ml = __ldcg(reinterpret_cast<const float2*>(ml_part) + base + t);
  const float mx = pgk_block_max(ml.x, scratch);
  // An empty split (-inf, 0) weighs 0; so does everything when all are empty. An all-NaN
  // split (max -inf, sum NaN) keeps its weight so the NaN reaches l.
  const float wt =
      (t < splits && !(ml.x == -PGK_INF && ml.y == 0.0f)) ? exp2f(ml.x - mx) : 0.0f;
  if (t < splits) wsh[t] = wt;
  const float l = pgk_block_sum(wt * ml.y, scratch);  // its barriers also publish wsh
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = sg; s0 < splits; s0 += SG * PGK_RUNROLL) {
    if (s0 != sg) load_round(s0, v);
#pragma unroll
    for (int u = 0; u < PGK_RUNROLL; ++u) {
      const int s = s0 + u * SG;
      const float w = s < splits ? wsh[s] : 0.0f;
      if (w != 0.0f) {  // an empty split never wrote its o_part
        acc.x += w * v[u].x;
        acc.y += w * v[u].y;
        acc.z += w * v[u].z;
        acc.w += w * v[u].w;
      }
    }
  }
  part[sg][c4] = acc;
  __syncthreads();
  if (t < PGK_D) {
    const int cc = t / 4, e = t % 4;
    float tot = 0.0f;
#pragma unroll
    for (int g = 0; g < SG; ++g) tot += reinterpret_cast<const float*>(&part[g][cc])[e];
    // ctx_len == 0 (or kv_start >= ctx_len) leaves every split empty: zeros; NaN stays.
    o[b * o_sb + h * o_sh + t] = pgk_from_float<pgk_t>(l == 0.0f ? 0.0f : tot / l);
  }
}
#endif

// ------------------------------------------------------------------------------------------
// Tensor-core variant for bf16/f16 (pgk_attn_decode_mma): same workspace and merges.
//
// The CUDA-core kernel above spends ~3x longer on arithmetic than on moving a tile, so it
// cannot keep HBM busy. Here the products run on mma.sync m16n8k16 tensor-core tiles,
// transposed: S^T = K Q^T and O^T += V^T P^T, so the 16 rows of a tile are keys (then
// head_dim) and its 8 columns are the query heads (G <= 16: one or two column blocks). Q^T
// stays in registers as B fragments for the whole kernel; P^T goes from the S^T
// accumulators into B fragments through movmatrix (8x8 transposes in registers), so scores
// never touch shared memory. (As S = Q K^T, with the heads on the 16 rows, G = 8 left half
// of every tile padding: twice the mma work, ~30% longer per tile at B1 ctx 8192.) Each of
// the 4 warps streams its own 32-key tiles (warp w takes tiles w, w+4, ...) through
// PGK_MSTAGES private cp.async stages with no block barrier in the loop; the warps'
// (max, sum, O) states merge once at the end.
#ifndef PGK_MSTAGES
#define PGK_MSTAGES 2
#endif
#define PGK_MW 4  // warps per block (8, one tile each, measured slower at B1 and B8)
#define PGK_MTK 32                      // keys per warp tile
#define PGK_MLD (PGK_D + 8)             // smem row: 16-byte pad keeps ldmatrix conflict-free
#define PGK_MTILE (PGK_MTK * PGK_MLD)   // elements of one K (or V) tile
#define PGK_MOLD (PGK_D + 4)            // f32 row of a warp's O state at the end
#define PGK_MWS (16 * PGK_MOLD + 32)    // f32 of one warp's state: O, m [16], l [16]

template <typename A, typename B> struct pgk_dsame { static constexpr bool value = false; };
template <typename A> struct pgk_dsame<A, A> { static constexpr bool value = true; };

PGK_DEVICE void pgk_dldm_x4(unsigned* r, const void* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
PGK_DEVICE void pgk_dldm_x4_t(unsigned* r, const void* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
PGK_DEVICE void pgk_dmma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  if constexpr (pgk_dsame<pgk_t, __nv_bfloat16>::value) {
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
// An 8x8 matrix of 16-bit elements in mma fragment layout, transposed (thread (r, c) gets
// elements (2c, r) and (2c + 1, r)).
PGK_DEVICE unsigned pgk_dmovt(unsigned x) {
  unsigned y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
// Two floats as one register of two 16-bit elements, the lower k index in the low half.
PGK_DEVICE unsigned pgk_dpack(float lo, float hi) {
  pgk_vec<pgk_t, 2> v;
  v.v[0] = pgk_from_float<pgk_t>(lo);
  v.v[1] = pgk_from_float<pgk_t>(hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// One PGK_MTK-key tile of a tensor-core decode warp (keys key0 on; those from `end` on
// masked): S^T = K Q^T from the tile's keys ks and the queries' B fragments qb, the online
// softmax's running max m_r and sums l_r brought up to it, and O^T += V^T P^T from its
// values vs (both tiles PGK_MLD-element rows in shared memory). Fragment (r, c) of thread
// (qr, qc): rows qr, qr + 8; columns 2 qc, 2 qc + 1.
template <int NB>
PGK_DEVICE void pgk_dec_mma_tile(const pgk_t* ks, const pgk_t* vs,
                                 const unsigned (&qb)[NB][PGK_D / 16][2], int key0, int end,
                                 float sl2, float (&m_r)[NB][2], float (&l_r)[NB][2],
                                 float (&oacc)[PGK_D / 16][NB][4]) {
  constexpr int KS = PGK_D / 16;
  const int lane = threadIdx.x & 31, qr = lane >> 2;
  float s[2][NB][4];  // S^T: [16-key half][column block][fragment]
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mb][nb][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) {
      unsigned a4[4];  // K rows mb*16.., columns kk*16..: (r0-7,k0-7) (r8-15,k0-7) ...
      pgk_dldm_x4(a4, ks + (mb * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PGK_MLD + kk * 16 +
                          (lane >> 4) * 8);
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) pgk_dmma(s[mb][nb], a4, qb[nb][kk][0], qb[nb][kk][1]);
    }
  float mx[NB][2];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) mx[nb][0] = mx[nb][1] = -PGK_INF;
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + mb * 16 + qr + (e >> 1) * 8;
        s[mb][nb][e] = key < end ? s[mb][nb][e] * sl2 : -PGK_INF;
        mx[nb][e & 1] = max(mx[nb][e & 1], s[mb][nb][e]);
      }
  float alpha[NB][2];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // The 8 threads of a column (lanes qc + 4 i) share a head; a tile with key0 < end
      // has a finite max (unless every score is NaN: then max -inf and NaN below).
      float m = mx[nb][h];
      m = max(m, __shfl_xor_sync(0xffffffffu, m, 4));
      m = max(m, __shfl_xor_sync(0xffffffffu, m, 8));
      m = max(m, __shfl_xor_sync(0xffffffffu, m, 16));
      const float mn = max(m_r[nb][h], m);
      alpha[nb][h] = exp2f(m_r[nb][h] - mn);
      m_r[nb][h] = mn;
      l_r[nb][h] *= alpha[nb][h];
    }
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[mb][nb][e] = exp2f(s[mb][nb][e] - m_r[nb][e & 1]);
        l_r[nb][e & 1] += s[mb][nb][e];
      }
#pragma unroll
  for (int dp = 0; dp < PGK_D / 16; ++dp)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[dp][nb][e] *= alpha[nb][e & 1];
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {  // 16 keys a step: the S^T rows of half kk
    unsigned pb[NB][2];             // P^T as B fragments: 8x8 blocks of S^T, transposed
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      pb[nb][0] = pgk_dmovt(pgk_dpack(s[kk][nb][0], s[kk][nb][1]));
      pb[nb][1] = pgk_dmovt(pgk_dpack(s[kk][nb][2], s[kk][nb][3]));
    }
#pragma unroll
    for (int dp = 0; dp < PGK_D / 16; ++dp) {
      unsigned a4[4];  // V^T rows dp*16.. (head_dim), columns kk*16.. (keys)
      pgk_dldm_x4_t(a4, vs + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * PGK_MLD + dp * 16 +
                            ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) pgk_dmma(oacc[dp][nb], a4, pb[nb][0], pb[nb][1]);
    }
  }
}

// The end of a tensor-core decode block (pgk_attn_decode_mma, pgk_paged_decode_mma_row),
// once its warps have streamed their tiles: each warp's online-softmax state (its O^T
// fragments oacc, per-head max m_r and partial sums l_r, a head's keys spread over its
// column's lanes) goes to shared memory `smem` (the stages, free once every warp's loads
// have landed), and the block merges them into o [PGK_G heads, o_sh apart] normalised where
// it is the row's only split, else into its unnormalised partial o_part and (max, sum) pairs
// ml_part at slot `part`, as the merge kernels read them.
template <int NB>
PGK_DEVICE void pgk_dec_mma_end(float (&oacc)[PGK_D / 16][NB][4], const float (&m_r)[NB][2],
                                float (&l_r)[NB][2], unsigned char* smem, int splits,
                                long long part, float* __restrict__ ml_part,
                                float* __restrict__ o_part, pgk_t* __restrict__ o, long long o_sh) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int qr = lane >> 2, qc = lane & 3;
  pgk_cp_async_wait<0>();
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the keys of a head are spread over its column's lanes
      l_r[nb][h] += __shfl_xor_sync(0xffffffffu, l_r[nb][h], 4);
      l_r[nb][h] += __shfl_xor_sync(0xffffffffu, l_r[nb][h], 8);
      l_r[nb][h] += __shfl_xor_sync(0xffffffffu, l_r[nb][h], 16);
    }
  __syncthreads();  // every warp is done with its stages: reuse them for the merge

  // Per-warp states (f32): O [16][PGK_MOLD] (row = head), m [16], l [16]. Rows are padded
  // by 4 floats so the 8 x 4 lanes of one O^T fragment store hit distinct banks (unpadded,
  // the rows of one column shared a bank: ~0.6 us of conflicts at B1 ctx 8192).
  constexpr int LD = PGK_MOLD, WS = PGK_MWS, NT = PGK_MW * 32;
  float* wst = reinterpret_cast<float*>(smem);
  float* wo = wst + warp * WS;
#pragma unroll
  for (int dp = 0; dp < PGK_D / 16; ++dp)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        wo[(nb * 8 + 2 * qc + (e & 1)) * LD + dp * 16 + qr + (e >> 1) * 8] = oacc[dp][nb][e];
  if (qr == 0) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        wo[16 * LD + nb * 8 + 2 * qc + h] = m_r[nb][h];
        wo[16 * LD + 16 + nb * 8 + 2 * qc + h] = l_r[nb][h];
      }
  }
  __syncthreads();
  // Each warp's weight per head (wgt [MW][G]) and the head's sum (tot [G]), once, so the
  // column loop below is loads and FMAs only (with the exp2 per element it took ~1 us).
  float* wgt = wst + PGK_MW * WS;
  float* tot = wgt + PGK_MW * PGK_G;
  if (tid < PGK_G) {
    float mmax = -PGK_INF;
#pragma unroll
    for (int w = 0; w < PGK_MW; ++w) mmax = max(mmax, wst[w * WS + 16 * LD + tid]);
    float lsum = 0.0f;
#pragma unroll
    for (int w = 0; w < PGK_MW; ++w) {
      const float mw = wst[w * WS + 16 * LD + tid];
      const float lw = wst[w * WS + 16 * LD + 16 + tid];
      // A warp with no tile (-inf, 0): 0; an all-NaN one (-inf, NaN) keeps its NaN.
      const float f = (mw == -PGK_INF && lw == 0.0f) ? 0.0f : exp2f(mw - mmax);
      wgt[w * PGK_G + tid] = f;
      lsum += f * lw;
    }
    tot[tid] = lsum;
    if (splits > 1) {
      ml_part[(part + (long long)tid * splits) * 2] = mmax;
      ml_part[(part + (long long)tid * splits) * 2 + 1] = lsum;
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < (PGK_G * PGK_D + NT - 1) / NT; ++i) {
    const int e = tid + i * NT;
    if (e < PGK_G * PGK_D) {
      const int g = e / PGK_D, d = e % PGK_D;
      float acc = 0.0f;
#pragma unroll
      for (int w = 0; w < PGK_MW; ++w) acc += wgt[w * PGK_G + g] * wst[w * WS + g * LD + d];
      if (splits == 1)  // a non-empty block's sum is positive
        o[g * o_sh + d] = pgk_from_float<pgk_t>(acc / tot[g]);
      else
        o_part[(part + (long long)g * splits) * PGK_D + d] = acc;
    }
  }
}

// ------------------------------------------------------------------------------------------
// Append mode (PGK_APPEND 1, ir op sdpa_append): the kernel stores this step's key and value
// at row pos of the caches and attends over them with it; with PGK_ROPE (1 half-split,
// 2 interleaved) it rotates q and the new key itself (one table row, cos_r / sin_r of type
// PGK_CS), as pgk_rope would (rope.cuh: float math, one rounding). This replaces three
// kernels of a decode step (rope, two cache stores), so it is written for latency: every
// read of this step's data (scalars, q, the new row, tables) is issued at once, the cache
// tiles are requested before the row is stored, and the tile holding pos is patched in
// shared memory from the block's own copy of the row instead of read back.
#ifndef PGK_APPEND
#define PGK_APPEND 0
#endif
#ifndef PGK_ROPE
#define PGK_ROPE 0
#endif
#ifndef PGK_CS
#define PGK_CS PGK_T
#endif
typedef PGK_CS pgk_dcs;

// Pair jj of a row under the rope layout: (jj, jj + D/2) half-split (and without rope:
// any pairing covers the row), (2jj, 2jj + 1) interleaved.
PGK_DEVICE int pgk_pair_elem(int jj, int which) {
#if PGK_ROPE == 2
  return 2 * jj + which;
#else
  return jj + which * (PGK_D / 2);
#endif
}

// (x0, x1) rotated by (c, s) as pgk_rope computes it (float math); unrotated without rope.
PGK_DEVICE void pgk_rope_pair(pgk_t x0, pgk_t x1, pgk_dcs c, pgk_dcs s, float& r0, float& r1) {
  const float f0 = pgk_to_float(x0), f1 = pgk_to_float(x1);
#if PGK_ROPE
  const float cf = pgk_to_float(c), sf = pgk_to_float(s);
  r0 = f0 * cf - f1 * sf;
  r1 = f1 * cf + f0 * sf;
#else
  (void)c;
  (void)s;
  r0 = f0;
  r1 = f1;
#endif
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_attn_decode_mma)
extern "C" __global__ void __launch_bounds__(PGK_MW * 32)
    pgk_attn_decode_mma(const pgk_t* __restrict__ q, const pgk_t* kc, const pgk_t* vc,
                        const int* __restrict__ ctx_len, float* __restrict__ o_part,
                        float* __restrict__ ml_part, int n_heads, int group, float scale,
                        long long q_sb, long long q_sh, long long k_sb, long long k_sh,
                        long long k_ss, long long v_sb, long long v_sh, long long v_ss,
                        const int* __restrict__ kv_start, long long kvs_stride, int max_seq,
                        pgk_t* __restrict__ o, long long o_sb, long long o_sh,
                        unsigned* __restrict__ counters, const pgk_t* __restrict__ k_new,
                        const pgk_t* __restrict__ v_new, long long kn_sb, long long kn_sh,
                        long long vn_sb, long long vn_sh, const int* __restrict__ pos_p,
                        const pgk_dcs* __restrict__ cos_r, const pgk_dcs* __restrict__ sin_r,
                        long long* __restrict__ err, long long tag, int kv_early) {
  static_assert(PGK_G <= 16, "one mma tile holds 16 query heads");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  pgk_t* smem = reinterpret_cast<pgk_t*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int qr = lane >> 2, qc = lane & 3;  // fragment row / column-pair of this thread
  const int split = blockIdx.x, splits = gridDim.x;
  const int n_sub = group / PGK_G;
  const int kvh = blockIdx.y / n_sub, b = blockIdx.z;
  const int h0 = kvh * group + (blockIdx.y % n_sub) * PGK_G;
  const long long part = ((long long)b * n_heads + h0) * splits + split;
  const long long head0 = ((long long)b * n_heads + h0) * splits;
  o += b * o_sb + h0 * o_sh;
  unsigned* counter = counters + b * gridDim.y + blockIdx.y;
  kc += b * k_sb + kvh * k_sh;
  vc += b * v_sb + kvh * v_sh;
  pgk_t* wsm = smem + warp * (PGK_MSTAGES * 2 * PGK_MTILE);

  // This block's keys [start, end): each warp takes tiles warp, warp + PGK_MW, ... of
  // PGK_MTK keys, streamed through its PGK_MSTAGES private stages (issue(it): its it-th).
  int start = 0, end = 0, my_tiles = 0;
  auto set_range = [&](int s, int e) {
    start = s;
    end = e;
    const int n_tiles = s < e ? (e - s + PGK_MTK - 1) / PGK_MTK : 0;
    my_tiles = warp < n_tiles ? (n_tiles - warp + PGK_MW - 1) / PGK_MW : 0;
  };
  auto issue = [&](int it) {
    pgk_t* ks = wsm + (it % PGK_MSTAGES) * 2 * PGK_MTILE;
    pgk_t* vs = ks + PGK_MTILE;
    const int key0 = start + (warp + it * PGK_MW) * PGK_MTK;
    constexpr int CH = PGK_D / 8;  // 16-byte chunks per row
#pragma unroll 4
    for (int e = lane; e < PGK_MTK * CH; e += 32) {
      const int j = e / CH, cc = (e % CH) * 8;
      const bool in = key0 + j < end;
      const long long key = in ? key0 + j : start;
      pgk_cp_async16(ks + j * PGK_MLD + cc, kc + key * k_ss + cc, in);
      pgk_cp_async16(vs + j * PGK_MLD + cc, vc + key * v_ss + cc, in);
    }
  };
  auto first_stages = [&]() {  // one commit group per stage, empty ones too
#pragma unroll
    for (int it = 0; it < PGK_MSTAGES; ++it) {
      if (it < my_tiles) issue(it);
      pgk_cp_async_commit();
    }
  };

  if (kv_early) {
    // The cache rows this launch reads were written before the graph ran (a captured
    // decode step; this step's own row, if any, is patched below from the block's copy):
    // fill every stage while the kernels before still run. The range comes from the live
    // length and start as read now, a guess until the wait: it is read again after it and
    // the stages refilled if it changed.
    int s, e;
    pgk_dec_range(ctx_len, kv_start, kvs_stride, max_seq, b, split, splits, PGK_MTK, s, e,
                  nullptr, 0);  // checked when read again after the wait
    set_range(s, e);
    first_stages();
  } else if (splits == 1) {
    // One split (short caches, the decode step of a small max_seq_len) reads its head's
    // keys and values from 0 up to the live length: pull the first PGK_DEC_PF positions
    // into L2 while the kernels before still run. A hint only: the real reads follow the
    // wait.
    constexpr int LPR = (PGK_D * (int)sizeof(pgk_t) + 127) / 128;  // 128-byte lines a row
    constexpr int EPL = 128 / (int)sizeof(pgk_t);
    const int lines = min(max_seq, PGK_DEC_PF) * LPR;
    for (int i = tid; i < lines; i += blockDim.x) {
      const long long row = i / LPR, off = (i % LPR) * EPL;
      pgk_prefetch_l2(kc + row * k_ss + off);
      pgk_prefetch_l2(vc + row * v_ss + off);
    }
  }
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();

  // Q^T as B fragments: n = heads (zero beyond G), k = head_dim. Read first, so these
  // loads and those of the length (below) take one round trip together (through L1: the
  // quads of a row share its lines; __ldcg here measured 1.6 us slower at B1 ctx 8192).
  constexpr int KS = PGK_D / 16, NB = (PGK_G + 7) / 8;  // k steps, 8-head column blocks
  unsigned qb[NB][KS][2];
  auto load_q = [&](const pgk_t* q0, long long sh) {  // head h's row at q0 + h * sh
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int head = nb * 8 + qr, col = ks * 16 + i * 8 + 2 * qc;
          qb[nb][ks][i] =
              head < PGK_G ? *reinterpret_cast<const unsigned*>(q0 + head * sh + col) : 0u;
        }
  };
#if !(PGK_APPEND && PGK_ROPE)  // else rotated into q_rot first (below)
  load_q(q + b * q_sb + (long long)h0 * q_sh, q_sh);
#endif

  int r_start, r_end;  // the range as it is now
#if PGK_APPEND
  // Every read this step's own data needs, issued at once (one round trip): the scalars,
  // this thread's pairs of q and of the new key/value row, and their table entries.
  constexpr int HALF = PGK_D / 2, NTH = PGK_MW * 32;
  constexpr int NQ = PGK_ROPE ? (PGK_G * HALF + NTH - 1) / NTH : 1;  // q pairs a thread
  const int hi_raw = pgk_read_i32(ctx_len, max_seq);
  const int lo_raw = kv_start ? __ldcg(kv_start + b * kvs_stride) : 0;
  const int p_raw = pgk_read_i32(pos_p, 0);
  pgk_t qx[NQ][2];
  pgk_dcs qcs[NQ][2];
#pragma unroll
  for (int i = 0; i < NQ; ++i) {
    if (!PGK_ROPE) break;  // q goes straight into its fragments
    const int pr = tid + i * NTH, g = min(pr / HALF, PGK_G - 1), jj = pr % HALF;
    const pgk_t* qrow = q + b * q_sb + (long long)(h0 + g) * q_sh;
    qx[i][0] = qrow[pgk_pair_elem(jj, 0)];
    qx[i][1] = qrow[pgk_pair_elem(jj, 1)];
    qcs[i][0] = cos_r[jj];
    qcs[i][1] = sin_r[jj];
  }
  const pgk_t* krow = k_new + b * kn_sb + kvh * kn_sh;
  const pgk_t* vrow = v_new + b * vn_sb + kvh * vn_sh;
  const int jr = min(tid, HALF - 1);  // the row pair of this thread (threads < HALF)
  const pgk_t k0 = krow[pgk_pair_elem(jr, 0)], k1 = krow[pgk_pair_elem(jr, 1)];
  const pgk_t v0 = vrow[pgk_pair_elem(jr, 0)], v1 = vrow[pgk_pair_elem(jr, 1)];
  const pgk_dcs rc = PGK_ROPE ? cos_r[jr] : pgk_dcs(), rs = PGK_ROPE ? sin_r[jr] : pgk_dcs();

  int lo, hi;
  const int p = p_raw < 0 ? p_raw + max_seq : p_raw;
  const bool p_ok = p >= 0 && p < max_seq;
  // A bad position is the user's error; the length derived from it (pos + 1) is then bad
  // too, so the lengths are checked only once the position is known good.
  if (p_ok) pgk_dec_check(hi_raw, lo_raw, max_seq, err, tag);
  pgk_dec_bounds(hi_raw, lo_raw, max_seq, lo, hi);
  pgk_dec_share(lo, hi, split, splits, PGK_MTK, r_start, r_end);
  // Who stores row p: every block whose share holds it (blocks of one kv head store the
  // same values, and each patches its own copy of the tile, so none waits on another),
  // or, if no share holds it, split 0 of the head's first block row.
  const bool held = p_ok && p >= r_start && p < r_end;
  const bool store =
      held || (p_ok && (p < lo || p >= hi) && split == 0 && blockIdx.y % n_sub == 0);
#else
  pgk_dec_range(ctx_len, kv_start, kvs_stride, max_seq, b, split, splits, PGK_MTK, r_start,
                r_end, err, tag);
  (void)k_new, (void)v_new, (void)kn_sb, (void)kn_sh, (void)vn_sb, (void)vn_sh;
  (void)pos_p, (void)cos_r, (void)sin_r;
#endif
  if (!kv_early || r_start != start || r_end != end) {
    if (kv_early) {  // the guess was wrong: drop the early tiles (each warp its own)
      pgk_cp_async_wait<0>();
      __syncwarp();
    }
    set_range(r_start, r_end);
    first_stages();
  }
#if PGK_APPEND
  // The tiles may hold row p as it was: the warp whose tile holds p patches it from
  // new_row once that tile lands. q_rot: this block's query heads, rotated.
  __shared__ __align__(16) pgk_t new_row[2][PGK_D];
#if PGK_ROPE
  __shared__ __align__(16) pgk_t q_rot[PGK_G][PGK_D];
#pragma unroll
  for (int i = 0; i < NQ; ++i) {
    const int pr = tid + i * NTH, g = pr / HALF, jj = pr % HALF;
    if (g < PGK_G) {
      float r0, r1;
      pgk_rope_pair(qx[i][0], qx[i][1], qcs[i][0], qcs[i][1], r0, r1);
      q_rot[g][pgk_pair_elem(jj, 0)] = pgk_from_float<pgk_t>(r0);
      q_rot[g][pgk_pair_elem(jj, 1)] = pgk_from_float<pgk_t>(r1);
    }
  }
#else
  (void)qx;
  (void)qcs;
#endif
  if (tid < HALF) {
    float r0, r1;
    pgk_rope_pair(k0, k1, rc, rs, r0, r1);
    const int e0 = pgk_pair_elem(tid, 0), e1 = pgk_pair_elem(tid, 1);
    const pgk_t kr0 = pgk_from_float<pgk_t>(r0), kr1 = pgk_from_float<pgk_t>(r1);
    new_row[0][e0] = kr0;
    new_row[0][e1] = kr1;
    new_row[1][e0] = v0;
    new_row[1][e1] = v1;
    if (store) {
      pgk_t* kw = const_cast<pgk_t*>(kc) + p * k_ss;
      pgk_t* vw = const_cast<pgk_t*>(vc) + p * v_ss;
      kw[e0] = kr0;
      kw[e1] = kr1;
      vw[e0] = v0;
      vw[e1] = v1;
    }
  }
  if (!p_ok && tid == 0 && split == 0 && blockIdx.y % n_sub == 0 && err &&
      atomicCAS(reinterpret_cast<unsigned long long*>(err), 0ull, PGK_ERR_INDEX) == 0ull) {
    err[1] = tag;
    err[2] = p_raw;
    err[3] = max_seq;
  }
  __syncthreads();  // new_row and q_rot before any read of them
#endif
  if (start >= end) {
    if (splits == 1) return pgk_dec_zero(o, o_sh);
    for (int g = tid; g < PGK_G; g += blockDim.x) {
      ml_part[(part + (long long)g * splits) * 2] = -PGK_INF;
      ml_part[(part + (long long)g * splits) * 2 + 1] = 0.0f;
    }
    if (counters && pgk_dec_arrive(counter, splits))
      pgk_dec_merge<PGK_MW * 32>(o_part + head0 * PGK_D, ml_part + head0 * 2, o, o_sh, splits,
                                 smem_raw);
    return;
  }

#if PGK_APPEND && PGK_ROPE
  load_q(&q_rot[0][0], PGK_D);
#endif

  // The products run transposed, S^T = K Q^T and O^T += V^T P^T: keys (then head_dim) on
  // the mma's 16 rows and the query heads on its 8 columns, so G = 8 heads fill the tile
  // (as Q K^T, the heads sat on 16 rows, half of them padding: twice the mma work).
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
#if PGK_APPEND
    if (held && p >= key0 && p < key0 + PGK_MTK) {  // this step's row, as stored
      pgk_t* row = const_cast<pgk_t*>(ks) + (p - key0) * PGK_MLD;
      for (int e = lane; e < PGK_D; e += 32) {
        row[e] = new_row[0][e];
        row[PGK_MTILE + e] = new_row[1][e];
      }
      __syncwarp();
    }
#endif

    pgk_dec_mma_tile(ks, vs, qb, key0, end, sl2, m_r, l_r, oacc);
    __syncwarp();  // every lane is done with this stage before it is refilled
    if (it + PGK_MSTAGES < my_tiles) issue(it + PGK_MSTAGES);
    pgk_cp_async_commit();
  }
  pgk_dec_mma_end(oacc, m_r, l_r, smem_raw, splits, part, ml_part, o_part, o, o_sh);
  if (counters && splits > 1 && pgk_dec_arrive(counter, splits))
    pgk_dec_merge<PGK_MW * 32>(o_part + head0 * PGK_D, ml_part + head0 * 2, o, o_sh, splits,
                               smem_raw);
}
#endif
