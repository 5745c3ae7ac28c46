// Rotary position embedding on x[b, h, s, :] (head_dim D contiguous; batch, head and seq
// strides are arguments, so [B, H, S, D] and [B, S, H, D] views both work in place or not).
//
// cos/sin tables have shape [max_pos, D/2] (row stride given). Token s uses table row
// pos0 + s, with pos0 read from a device int32 (null: 0), so a captured decode graph
// serves every step without re-capture.
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
  constexpr int V = PGK_VEC;
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
  const pgk_t* xr = x + b * xs_b + h * xs_h + s * xs_s;
  pgk_t* yr = y + b * ys_b + h * ys_h + s * ys_s;
  const pgk_cs* cr = cos_t + (long long)pos * cs_stride;
  const pgk_cs* sr = sin_t + (long long)pos * cs_stride;
  const int half = head_dim >> 1;
  const int j = threadIdx.x * V;  // first pair index of this thread
  if (j >= half) return;
  auto c = pgk_load<V>(cr + j);
  auto sn = pgk_load<V>(sr + j);
#if PGK_INTERLEAVED
  // V pairs = 2V contiguous elements, moved as two vectors.
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
