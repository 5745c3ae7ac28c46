// Sorts along the last axis of [rows, cols] (row stride given), one block a row: a bitonic
// network over the row padded to a power of two, in dynamic shared memory (keys, then the
// int positions they came from). pgk_sort writes the first k values and/or their int64
// positions (either pointer may be 0) as contiguous [rows, k].
//
// Order: ascending with NaN after every number, or (descending) its reverse with NaN
// first; equal keys (and NaNs among themselves) keep their index order, so the network's
// result is the stable sort's, whatever order the compare-exchanges ran in. Keys are the
// values widened exactly (float for f32/f16/bf16, double, long long for integers and bools);
// values are re-read from x at the sorted positions, so they are stored bit for bit.
#include "common.cuh"

#ifndef PGK_KEY
#define PGK_KEY float
#endif
#ifndef PGK_SORT_THREADS
#define PGK_SORT_THREADS 512
#endif

typedef PGK_KEY pgk_key;

template <typename X> PGK_DEVICE pgk_key pgk_sort_key(X x) { return (pgk_key)x; }
template <> PGK_DEVICE pgk_key pgk_sort_key<__half>(__half x) { return (pgk_key)__half2float(x); }
template <> PGK_DEVICE pgk_key pgk_sort_key<__nv_bfloat16>(__nv_bfloat16 x) {
  return (pgk_key)__bfloat162float(x);
}

// Whether (ka, ia) goes before (kb, ib); padding (index -1) goes after everything.
PGK_DEVICE bool pgk_sort_before(pgk_key ka, int ia, pgk_key kb, int ib, bool desc) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  const bool an = ka != ka, bn = kb != kb;
  if (an || bn) {
    if (an && bn) return ia < ib;
    return desc ? an : bn;
  }
  if (ka != kb) return desc ? ka > kb : ka < kb;
  return ia < ib;
}

extern "C" __global__ void __launch_bounds__(PGK_SORT_THREADS)
    pgk_sort(const pgk_t* __restrict__ x, pgk_t* __restrict__ values,
             long long* __restrict__ indices, int cols, int n_pad, int k,
             long long x_row_stride, int descending) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  extern __shared__ __align__(16) unsigned char pgk_sort_smem[];
  pgk_key* key = reinterpret_cast<pgk_key*>(pgk_sort_smem);
  int* pos = reinterpret_cast<int*>(key + n_pad);
  const bool desc = descending != 0;
  const long long r = blockIdx.x;
  const pgk_t* xr = x + r * x_row_stride;
  for (int i = threadIdx.x; i < n_pad; i += blockDim.x) {
    if (i < cols) {
      key[i] = pgk_sort_key(xr[i]);
      pos[i] = i;
    } else {
      key[i] = (pgk_key)0;
      pos[i] = -1;
    }
  }
  const int half = n_pad >> 1;
  for (int size = 2; size <= n_pad; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int t = threadIdx.x; t < half; t += blockDim.x) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const pgk_key ki = key[i], kj = key[j];
        const int pi = pos[i], pj = pos[j];
        // Ascending runs where bit `size` of i is clear, descending where set: together
        // they form the bitonic sequences the next size merges.
        const bool swap = (i & size) == 0 ? pgk_sort_before(kj, pj, ki, pi, desc)
                                          : pgk_sort_before(ki, pi, kj, pj, desc);
        if (swap) {
          key[i] = kj;
          key[j] = ki;
          pos[i] = pj;
          pos[j] = pi;
        }
      }
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < k; c += blockDim.x) {
    const int p = pos[c];
    if (values) values[r * k + c] = xr[p];
    if (indices) indices[r * k + c] = (long long)p;
  }
}
