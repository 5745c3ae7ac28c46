// The key lengths attention reads from the device (kv_len, kv_start) must lie in
// [0, extent]; a value outside is recorded in the error word (`code`: codegen/prelude.py's
// ERR_KV_LEN or ERR_KV_START), which the backend raises at its next sync. The unfused attention path runs this before its masks,
// which would otherwise clamp a bad length silently.
#include "common.cuh"

#ifndef PGK_IDX
#define PGK_IDX int
#endif

extern "C" __global__ void pgk_attention_check_lengths(const PGK_IDX* __restrict__ values,
                                                       long long n, long long stride,
                                                       long long extent, long long* err,
                                                       long long tag, long long code) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    const long long x = (long long)values[i * stride];
    if ((x < 0 || x > extent) &&
        atomicCAS(reinterpret_cast<unsigned long long*>(err), 0ull, (unsigned long long)code) ==
            0ull) {
      err[1] = tag;
      err[2] = x;
      err[3] = extent;
    }
  }
}
