// Rotary position embedding on x[b, h, s, :] (head_dim D contiguous; batch, head and seq
// strides are arguments, so [B, H, S, D] and [B, S, H, D] views both work in place or not).
//
// cos/sin tables have shape [max_pos, D/2] (row stride given). Token s uses table row
// pos0 + s, with pos0 read from a device int32 (null: 0), so a captured decode graph
// serves every step without re-capture. pgk_rope_kv_write (below) also stores a prefill
// chunk's rotated keys and its values into the KV caches.
//   half-split (GPT-NeoX / HF Llama): pairs (j, j + D/2)
//   interleaved (GPT-J):              pairs (2j, 2j + 1)
// Each thread rotates PGK_VEC pairs: with PGK_VEC = 16 / sizeof(T) every access is 16 bytes.
#include "common.cuh"

#ifndef PGK_CS
#define PGK_CS PGK_T
#endif
typedef PGK_CS pgk_cs;

#ifndef PGK_INTERLEAVED
#define PGK_INTERLEAVED 0
#endif
#ifndef PGK_ERR_INDEX
#define PGK_ERR_INDEX 1  // the error word's code for a bad index (codegen/prelude.py)
#endif

// Rotates the PGK_VEC pairs from pair j of row xr into yr (may alias) by the angles of
// table rows cr / sr.
PGK_DEVICE void pgk_rope_pairs(const pgk_t* xr, pgk_t* yr, const pgk_cs* cr, const pgk_cs* sr,
                               int j, int half) {
  constexpr int V = PGK_VEC;
  auto c = pgk_load<V>(cr + j);
  auto sn = pgk_load<V>(sr + j);
#if PGK_INTERLEAVED
  // V pairs = 2V contiguous elements, moved as two vectors.
  (void)half;
  auto a = pgk_load<V>(xr + 2 * j);
  auto bq = pgk_load<V>(xr + 2 * j + V);
  pgk_vec<pgk_t, V> oa, ob;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int e = 2 * k;  // element index within the 2V-element run
    const pgk_t x0 = e < V ? a.v[e] : bq.v[e - V];
    const pgk_t x1 = e + 1 < V ? a.v[e + 1] : bq.v[e + 1 - V];
    const float cf = pgk_to_float(c.v[k]), sf = pgk_to_float(sn.v[k]);
    const float f0 = pgk_to_float(x0), f1 = pgk_to_float(x1);
    const pgk_t r0 = pgk_from_float<pgk_t>(f0 * cf - f1 * sf);
    const pgk_t r1 = pgk_from_float<pgk_t>(f1 * cf + f0 * sf);
    if (e < V) oa.v[e] = r0; else ob.v[e - V] = r0;
    if (e + 1 < V) oa.v[e + 1] = r1; else ob.v[e + 1 - V] = r1;
  }
  pgk_store<V>(yr + 2 * j, oa);
  pgk_store<V>(yr + 2 * j + V, ob);
#else
  auto a = pgk_load<V>(xr + j);
  auto bq = pgk_load<V>(xr + j + half);
  pgk_vec<pgk_t, V> oa, ob;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float cf = pgk_to_float(c.v[k]), sf = pgk_to_float(sn.v[k]);
    const float f0 = pgk_to_float(a.v[k]), f1 = pgk_to_float(bq.v[k]);
    oa.v[k] = pgk_from_float<pgk_t>(f0 * cf - f1 * sf);
    ob.v[k] = pgk_from_float<pgk_t>(f1 * cf + f0 * sf);
  }
  pgk_store<V>(yr + j, oa);
  pgk_store<V>(yr + j + half, ob);
#endif
}

// Block: x = pair-chunks of one row (D / 2 / PGK_VEC threads), y = rows of the block.
extern "C" __global__ void pgk_rope(const pgk_t* x, pgk_t* y,  // may alias: in place
                                    const pgk_cs* __restrict__ cos_t,
                                    const pgk_cs* __restrict__ sin_t,
                                    const int* __restrict__ pos_offset, int n_heads,
                                    int seq, int head_dim, long long rows,
                                    long long xs_b, long long xs_h, long long xs_s,
                                    long long ys_b, long long ys_h, long long ys_s,
                                    long long cs_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  // 32-bit index math: the launcher keeps rows below 2^31, and 64-bit division is a slow
  // subroutine call.
  const unsigned row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= (unsigned)rows) return;
  const unsigned bh = row / (unsigned)seq;
  const int s = (int)(row - bh * (unsigned)seq);
  const unsigned bb = bh / (unsigned)n_heads;
  const int h = (int)(bh - bb * (unsigned)n_heads);
  const long long b = bb;
  const int pos = pgk_read_i32(pos_offset, 0) + s;
  const int half = head_dim >> 1;
  const int j = threadIdx.x * PGK_VEC;  // first pair index of this thread
  if (j >= half) return;
  pgk_rope_pairs(x + b * xs_b + h * xs_h + s * xs_s, y + b * ys_b + h * ys_h + s * ys_s,
                 cos_t + (long long)pos * cs_stride, sin_t + (long long)pos * cs_stride, j,
                 half);
}

// A prefill chunk's rope and KV-cache stores in one launch (ir op rope_kv_write): x holds
// q_heads query heads, then kv_heads key heads ([B, H, T, D] over strides); token s uses
// table row s. Query rows are rotated into q_out, key rows rotated into
// k_cache[b, h, p + s], and v's rows copied to v_cache[b, h, p + s], where p is the
// chunk's first cache slot read from the device (int32 or int64 per pos_i64), wrapped
// like NumPy over its n_starts = S - T + 1 possible values; a start out of range records
// PGK_ERR_INDEX in the error word and stores nothing. Rows: B*H*T rotated, then B*KV*T
// copied, one per threadIdx.y as pgk_rope's (a 1-d grid over both).
extern "C" __global__ void pgk_rope_kv_write(
    const pgk_t* __restrict__ x, pgk_t* __restrict__ q_out, pgk_t* __restrict__ k_cache,
    pgk_t* __restrict__ v_cache, const pgk_t* __restrict__ v,
    const pgk_cs* __restrict__ cos_t, const pgk_cs* __restrict__ sin_t,
    const void* __restrict__ pos, int pos_i64, long long n_starts, int batch, int q_heads,
    int kv_heads, int seq, int head_dim, long long xs_b, long long xs_h, long long xs_s,
    long long qs_b, long long qs_h, long long qs_s, long long ks_b, long long ks_h,
    long long ks_s, long long cvs_b, long long cvs_h, long long cvs_s, long long vs_b,
    long long vs_h, long long vs_s, long long cs_stride, long long* __restrict__ err,
    long long tag) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  const int n_heads = q_heads + kv_heads;
  const unsigned rope_rows = (unsigned)(batch * n_heads * seq);
  unsigned row = blockIdx.x * blockDim.y + threadIdx.y;
  const long long raw = pos_i64 ? __ldcg(static_cast<const long long*>(pos))
                                : (long long)__ldcg(static_cast<const int*>(pos));
  const long long p = raw < 0 ? raw + n_starts : raw;
  const bool p_ok = p >= 0 && p < n_starts;
  if (!p_ok && row == 0 && threadIdx.x == 0 && err &&
      atomicCAS(reinterpret_cast<unsigned long long*>(err), 0ull, PGK_ERR_INDEX) == 0ull) {
    err[1] = tag;
    err[2] = raw;
    err[3] = n_starts;  // as the unfused store's dynamic slice reports it
  }
  const int half = head_dim >> 1;
  const int j = threadIdx.x * PGK_VEC;  // first pair index of this thread
  if (j >= half) return;
  // 32-bit index math, as pgk_rope's (the launcher keeps every row count below 2^31).
  if (row < rope_rows) {
    const unsigned bh = row / (unsigned)seq;
    const int s = (int)(row - bh * (unsigned)seq);
    const unsigned bb = bh / (unsigned)n_heads;
    const int h = (int)(bh - bb * (unsigned)n_heads);
    const long long b = bb;
    pgk_t* yr;
    if (h < q_heads) {
      yr = q_out + b * qs_b + h * qs_h + s * qs_s;
    } else {
      if (!p_ok) return;
      yr = k_cache + b * ks_b + (h - q_heads) * ks_h + (p + s) * ks_s;
    }
    pgk_rope_pairs(x + b * xs_b + h * xs_h + s * xs_s, yr, cos_t + (long long)s * cs_stride,
                   sin_t + (long long)s * cs_stride, j, half);
    return;
  }
  row -= rope_rows;
  if (!p_ok || row >= (unsigned)(batch * kv_heads * seq)) return;
  const unsigned bh = row / (unsigned)seq;
  const int s = (int)(row - bh * (unsigned)seq);
  const unsigned bb = bh / (unsigned)kv_heads;
  const int h = (int)(bh - bb * (unsigned)kv_heads);
  const long long b = bb;
  const pgk_t* src = v + b * vs_b + h * vs_h + s * vs_s;
  pgk_t* dst = v_cache + b * cvs_b + h * cvs_h + (p + s) * cvs_s;
  // The same elements a rotated row's thread moves: its V pairs in either layout.
#if PGK_INTERLEAVED
  pgk_store<PGK_VEC>(dst + 2 * j, pgk_load<PGK_VEC>(src + 2 * j));
  pgk_store<PGK_VEC>(dst + 2 * j + PGK_VEC, pgk_load<PGK_VEC>(src + 2 * j + PGK_VEC));
#else
  pgk_store<PGK_VEC>(dst + j, pgk_load<PGK_VEC>(src + j));
  pgk_store<PGK_VEC>(dst + j + half, pgk_load<PGK_VEC>(src + j + half));
#endif
}
