// Embedding gather: out[i, :] = table[ids[i], :] for a [vocab, dim] table.
//
// Ids are PGK_IDX (int or long long). An id outside [0, vocab) writes a zero row and never
// reads the table, so a bad token cannot fault the context or leak other memory.
#include "common.cuh"

#ifndef PGK_IDX
#define PGK_IDX int
#endif
typedef PGK_IDX pgk_idx;

// Block: x over vectors of a row, y over ids; grid.x over blocks of ids (no 65535 limit).
extern "C" __global__ void pgk_embedding(const pgk_t* __restrict__ table,
                                         const pgk_idx* __restrict__ ids,
                                         pgk_t* __restrict__ out, long long n_ids, int dim,
                                         long long vocab, long long table_stride,
                                         long long out_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  constexpr int V = PGK_VEC;
  const long long i = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  if (i >= n_ids) return;
  const long long id = (long long)ids[i];
  const bool ok = id >= 0 && id < vocab;
  const pgk_t* src = table + (ok ? id : 0) * table_stride;
  pgk_t* dst = out + i * out_stride;
  for (int c = threadIdx.x * V; c < dim; c += blockDim.x * V) {
    pgk_vec<pgk_t, V> v;
    if (ok) {
      v = pgk_load<V>(src + c);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v.v[k] = pgk_t{};  // value-init: zero for every type
    }
    pgk_store<V>(dst + c, v);
  }
}
