// Flash-style attention for prefill: O = softmax(scale * Q K^T [+ causal mask]) V.
//
// Q, O: [batch, heads, seq_q, D]; K, V: [batch, kv_heads, seq_k, D]; every operand has its
// own batch/head/seq strides (D contiguous). GQA: query head h reads kv head
// h / (heads / kv_heads). Causal masking is aligned to the bottom right (query i sees keys
// j <= i + seq_k - seq_q), which is plain causal for seq_q == seq_k and the right mask for
// a chunk of new tokens appended to a cache.
// kv_len / kv_start (device ints), the causal and the sliding-window masks follow the
// flash kernel's rules (pgk_attn_bounds / pgk_attn_rows in common.cuh). A key hidden from a
// row never reaches it: keys outside [kv_start, kv_len) load as zeros, and in P.V a key
// hidden by the per-row masks is skipped (a ballot of the visible keys), not multiplied by
// a zero probability (0 * NaN would leak a NaN or inf in its V row).
// Online softmax: scores never reach global memory. PGK_D (64 or 128) is compile-time.
// Block = 4 warps x PGK_ROWS query rows; K and V tiles of 32 keys go through shared memory
// as fp32 (K padded by one column so a lane-per-key read is conflict-free). In the score
// step a lane owns one key; in the P.V step a lane owns D/32 output columns and receives
// each probability by a shuffle. A CUDA-core kernel for float32 (bf16 / f16 go to the
// tensor-core attention_flash.cuh).
#include "common.cuh"

#ifndef PGK_D
#define PGK_D 128
#endif
#ifndef PGK_ROWS
#define PGK_ROWS 8
#endif
#define PGK_AW 4                     // warps per block
#define PGK_AQ (PGK_AW * PGK_ROWS)   // query rows per block
#define PGK_AK 32                    // keys per tile
#define PGK_DL (PGK_D / 32)          // output columns per lane
#ifndef PGK_ERR_INDEX
#define PGK_ERR_INDEX 1
#endif

PGK_DEVICE float pgk_exp2f(float x) { return exp2f(x); }

// Dynamic shared memory: q[AQ][D] | k[AK][D+1] | v[AK][D], all fp32.
extern "C" __global__ void __launch_bounds__(PGK_AW * 32)
    pgk_attention_prefill(const pgk_t* __restrict__ q, const pgk_t* __restrict__ k,
                          const pgk_t* __restrict__ v, pgk_t* __restrict__ o, int n_heads,
                          int n_kv_heads, int seq_q, int seq_k, float scale, int causal,
                          int window, const int* __restrict__ kv_len,
                          const int* __restrict__ kv_start, long long kvs_stride, int kv_wide,
                          long long q_sb, long long q_sh, long long q_ss, long long k_sb,
                          long long k_sh, long long k_ss, long long v_sb, long long v_sh,
                          long long v_ss, long long o_sb, long long o_sh, long long o_ss,
                          long long* __restrict__ err, long long tag) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;
  float* ks = qs + PGK_AQ * PGK_D;
  float* vs = ks + PGK_AK * (PGK_D + 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bh = blockIdx.y;
  const int b = bh / n_heads, h = bh % n_heads;
  const int kvh = h / (n_heads / n_kv_heads);
  const int q0 = blockIdx.x * PGK_AQ;
  q += b * q_sb + h * q_sh;
  o += b * o_sb + h * o_sh;
  k += b * k_sb + kvh * k_sh;
  v += b * v_sb + kvh * v_sh;
  // Scores go through exp2, so fold log2(e) into the scale once.
  const float qscale = scale * 1.4426950408889634f;

  for (int e = threadIdx.x; e < PGK_AQ * PGK_D; e += blockDim.x) {
    const int r = e / PGK_D, d = e % PGK_D;
    qs[e] = (q0 + r < seq_q) ? pgk_to_float(q[(q0 + r) * q_ss + d]) * qscale : 0.0f;
  }

  float m[PGK_ROWS], l[PGK_ROWS], acc[PGK_ROWS][PGK_DL];
#pragma unroll
  for (int r = 0; r < PGK_ROWS; ++r) {
    m[r] = -PGK_INF;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < PGK_DL; ++c) acc[r][c] = 0.0f;
  }
  int len, start;
  pgk_attn_bounds(kv_len, kv_start, kvs_stride, kv_wide, b, seq_k,
                  threadIdx.x == 0 && blockIdx.x == 0 && h == 0 ? err : nullptr, tag,
                  PGK_ERR_INDEX, len, start);
  const int last_q = min(q0 + PGK_AQ, seq_q) - 1;
  int k_begin, k_end, lo_last, hi_last;
  pgk_attn_rows(q0, seq_q, len, start, causal, window, k_begin, k_end);
  pgk_attn_rows(last_q, seq_q, len, start, causal, window, lo_last, hi_last);
  k_end = max(hi_last, k_begin);
  k_begin = k_begin / PGK_AK * PGK_AK;
  const int my_q0 = q0 + warp * PGK_ROWS;
  int row_lo[PGK_ROWS], row_hi[PGK_ROWS];
#pragma unroll
  for (int r = 0; r < PGK_ROWS; ++r)
    pgk_attn_rows(my_q0 + r, seq_q, len, start, causal, window, row_lo[r], row_hi[r]);

  for (int kt = k_begin; kt < k_end; kt += PGK_AK) {
    __syncthreads();  // previous tile fully consumed (and q written on the first pass)
    for (int e = threadIdx.x; e < PGK_AK * PGK_D; e += blockDim.x) {
      const int j = e / PGK_D, d = e % PGK_D;
      const bool in = kt + j >= start && kt + j < len;
      ks[j * (PGK_D + 1) + d] = in ? pgk_to_float(k[(kt + j) * k_ss + d]) : 0.0f;
      vs[j * PGK_D + d] = in ? pgk_to_float(v[(kt + j) * v_ss + d]) : 0.0f;
    }
    __syncthreads();
    if (my_q0 >= seq_q) continue;  // this warp has no rows; keep joining the barriers

    float s[PGK_ROWS];
#pragma unroll
    for (int r = 0; r < PGK_ROWS; ++r) s[r] = 0.0f;
    const float* kr = ks + lane * (PGK_D + 1);
#pragma unroll 4
    for (int d = 0; d < PGK_D; d += 4) {
      const float k0 = kr[d], k1 = kr[d + 1], k2 = kr[d + 2], k3 = kr[d + 3];
#pragma unroll
      for (int r = 0; r < PGK_ROWS; ++r) {
        const float4 qv = *reinterpret_cast<const float4*>(qs + (warp * PGK_ROWS + r) * PGK_D + d);
        s[r] += qv.x * k0 + qv.y * k1 + qv.z * k2 + qv.w * k3;
      }
    }
    const int j = kt + lane;
#pragma unroll
    for (int r = 0; r < PGK_ROWS; ++r) {
      const bool ok = j >= row_lo[r] && j < row_hi[r];
      const unsigned vis = __ballot_sync(0xffffffffu, ok);
      const float sc = ok ? s[r] : -PGK_INF;
      const float tmax = pgk_warp_max(sc);
      const float mn = max(m[r], tmax);
      // A row that has seen no visible key yet keeps m = -inf; exp2 of (-inf) - (-inf)
      // would be NaN, so such rows take p = 0 and alpha = 1. The max skips NaN (fmaxf), so
      // a NaN score is passed on as p itself: it reaches l and acc, as in the reference.
      const float p = isnan(sc) ? sc : (mn == -PGK_INF) ? 0.0f : pgk_exp2f(sc - mn);
      const float alpha = (mn == -PGK_INF) ? 1.0f : pgk_exp2f(m[r] - mn);
      l[r] = l[r] * alpha + pgk_warp_sum(p);
      m[r] = mn;
      float pv[PGK_DL];
#pragma unroll
      for (int c = 0; c < PGK_DL; ++c) pv[c] = acc[r][c] * alpha;
#pragma unroll 8
      for (int jj = 0; jj < PGK_AK; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        if (!((vis >> jj) & 1u)) continue;  // hidden from this row: selected out
        const float* vr = vs + jj * PGK_D + lane * PGK_DL;
        if constexpr (PGK_DL == 4) {
          const float4 vv = *reinterpret_cast<const float4*>(vr);
          pv[0] += pj * vv.x;
          pv[1] += pj * vv.y;
          pv[2] += pj * vv.z;
          pv[3] += pj * vv.w;
        } else {
#pragma unroll
          for (int c = 0; c < PGK_DL; ++c) pv[c] += pj * vr[c];
        }
      }
#pragma unroll
      for (int c = 0; c < PGK_DL; ++c) acc[r][c] = pv[c];
    }
  }
#pragma unroll
  for (int r = 0; r < PGK_ROWS; ++r) {
    const int qi = my_q0 + r;
    if (qi >= seq_q) break;
    // A row with no visible key (seq_q > seq_k under the causal mask) writes zeros; a NaN
    // sum (a NaN or inf in what the row sees) stays NaN, and so does a row whose visible
    // scores are all -inf (the reference's exp(-inf - -inf) is NaN).
    const bool sees = row_hi[r] > row_lo[r];
    const float inv = !sees ? 0.0f : (m[r] == -PGK_INF ? __int_as_float(0x7fc00000) : 1.0f / l[r]);
#pragma unroll
    for (int c = 0; c < PGK_DL; ++c)
      o[qi * o_ss + lane * PGK_DL + c] = pgk_from_float<pgk_t>(acc[r][c] * inv);
  }
}
