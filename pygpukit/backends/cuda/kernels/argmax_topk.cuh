// Argmax and top-k over the last axis of [rows, cols] (row stride given), one block a row,
// for float32, float16 and bfloat16 (compared as float32, which is exact for all three).
//
// Order: NaN counts as larger than every number (as torch.topk and numpy.argmax treat it),
// and among equal values the lower index wins, so results are deterministic.
// Top-k (k <= 64) runs a radix select on order-preserving 32-bit keys: four 8-bit histogram
// passes find the k-th largest key, one pass gathers the winners in index order, and the
// k survivors are ranked in shared memory. Cost is five reads of the row whatever k is, and
// shared memory does not grow with cols, so vocabulary-sized rows work on every SM80+ part.
#include "common.cuh"

#ifndef PGK_AVEC
#define PGK_AVEC 1  // argmax: elements a load
#endif
#ifndef PGK_TOPK_THREADS
#define PGK_TOPK_THREADS 512
#endif

// Maps a float to an unsigned key with the same order; every NaN maps above +inf.
PGK_DEVICE unsigned pgk_order_key(float f) {
  if (f != f) return 0xffffffffu;
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

PGK_DEVICE bool pgk_better(float a, long long ia, float b, long long ib) {
  const unsigned ka = pgk_order_key(a), kb = pgk_order_key(b);
  return ka > kb || (ka == kb && ia < ib);
}

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_argmax)
extern "C" __global__ void pgk_argmax(const pgk_t* __restrict__ x, long long* __restrict__ out_idx,
                                      int cols, long long row_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  __shared__ float sv[32];
  __shared__ long long si[32];
  const pgk_t* xr = x + (long long)blockIdx.x * row_stride;
  float bv = 0.0f;
  long long bi = -1;
  auto consider = [&](float v, long long c) {
    if (bi < 0 || pgk_better(v, c, bv, bi)) {
      bv = v;
      bi = c;
    }
  };
  // PGK_AVEC elements a load (16 bytes where the launcher found the rows aligned), UN loads
  // in flight before the compares: one scalar load per compare left each thread waiting
  // out an L2 round trip per element (a 32000-wide row took 12 us).
  constexpr int V = PGK_AVEC;
  constexpr int UN = 8;
  const int step = (int)blockDim.x * V, cv = cols - cols % V;
  int c = (int)threadIdx.x * V;
  for (; c + (UN - 1) * step < cv; c += UN * step) {
    pgk_vec<pgk_t, V> v[UN];
#pragma unroll
    for (int u = 0; u < UN; ++u) v[u] = pgk_load<V>(xr + c + u * step);
#pragma unroll
    for (int u = 0; u < UN; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) consider(pgk_to_float(v[u].v[e]), c + u * (long long)step + e);
  }
  for (; c < cv; c += step) {
    const pgk_vec<pgk_t, V> v = pgk_load<V>(xr + c);
#pragma unroll
    for (int e = 0; e < V; ++e) consider(pgk_to_float(v.v[e]), c + e);
  }
  for (int j = cv + (int)threadIdx.x; j < cols; j += (int)blockDim.x)
    consider(pgk_to_float(xr[j]), j);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0) consider(ov, oi);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {  // the warps' winners, reduced by one warp's shuffles
    const bool has = lane < (int)((blockDim.x + 31) >> 5);
    bv = has ? sv[lane] : 0.0f;
    bi = has ? si[lane] : -1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0) consider(ov, oi);
    }
    if (lane == 0) out_idx[blockIdx.x] = bi;
  }
}
#endif

// Exclusive block-wide prefix count of a per-thread flag; also returns the block total.
PGK_DEVICE int pgk_block_prefix(bool flag, int* warp_counts, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int before = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int base = 0, sum = 0;
  const int nw = blockDim.x >> 5;
  for (int w = 0; w < nw; ++w) {
    const int c = warp_counts[w];
    base += w < warp ? c : 0;
    sum += c;
  }
  __syncthreads();
  *total = sum;
  return base + before;
}

// Launch with PGK_TOPK_THREADS threads (a multiple of 32). Outputs are sorted by value,
// descending (torch.topk(sorted=True)).
#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_topk)
extern "C" __global__ void __launch_bounds__(PGK_TOPK_THREADS)
    pgk_topk(const pgk_t* __restrict__ x, pgk_t* __restrict__ out_val,
             long long* __restrict__ out_idx, int cols, int k, long long row_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  __shared__ int hist[256];
  __shared__ int warp_counts[32];
  __shared__ unsigned s_prefix;
  __shared__ int s_need;
  __shared__ float cand_v[64];
  __shared__ int cand_i[64];
  const pgk_t* xr = x + (long long)blockIdx.x * row_stride;

  unsigned prefix = 0, mask = 0;
  int need = k;  // how many of the keys matching `prefix` still belong to the top k
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    // Loop bound rounded up to the block so whole warps stay converged for the match.
    for (int base = 0; base < cols; base += blockDim.x) {
      const int c = base + threadIdx.x;
      const unsigned key = c < cols ? pgk_order_key(pgk_to_float(xr[c])) : 0u;
      const bool in = c < cols && (key & mask) == prefix;
      const int bin = in ? (int)((key >> shift) & 0xff) : -1;
      // Values of one row share few top bytes; aggregating equal bins per warp turns up
      // to 32 serialised same-address atomics into one.
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      const int lane = threadIdx.x & 31;
      if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, d = 255;
      for (; d > 0; --d) {
        if (above + hist[d] >= need) break;
        above += hist[d];
      }
      s_prefix = prefix | ((unsigned)d << shift);
      s_need = need - above;
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    mask |= 0xffu << shift;
  }
  // prefix is now the k-th largest key: every key above it wins, and the first `need`
  // keys equal to it (lowest indices) fill the rest.
  int n_gt = 0, n_eq = 0;
  for (int base = 0; base < cols; base += blockDim.x) {
    const int c = base + threadIdx.x;
    float v = 0.0f;
    unsigned key = 0;
    if (c < cols) {
      v = pgk_to_float(xr[c]);
      key = pgk_order_key(v);
    }
    const bool gt = c < cols && key > prefix;
    const bool eq = c < cols && key == prefix;
    int tot_gt, tot_eq;
    const int pg = pgk_block_prefix(gt, warp_counts, &tot_gt);
    const int pe = pgk_block_prefix(eq, warp_counts, &tot_eq);
    if (gt) {
      cand_v[n_gt + pg] = v;
      cand_i[n_gt + pg] = c;
    }
    if (eq && n_eq + pe < need) {
      cand_v[(k - need) + n_eq + pe] = v;
      cand_i[(k - need) + n_eq + pe] = c;
    }
    n_gt += tot_gt;
    n_eq += tot_eq;
  }
  __syncthreads();
  if (threadIdx.x < k) {
    const float v = cand_v[threadIdx.x];
    const int i = cand_i[threadIdx.x];
    int rank = 0;
    for (int o = 0; o < k; ++o) rank += pgk_better(cand_v[o], cand_i[o], v, i) ? 1 : 0;
    out_val[(long long)blockIdx.x * k + rank] = xr[i];
    out_idx[(long long)blockIdx.x * k + rank] = i;
  }
}
#endif
