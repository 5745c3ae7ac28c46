// Batched matmul for every dtype: C[z] = A[z] @ B[z] with A [M, K], B [K, N], C [M, N].
//
// Every operand has its own row and column strides and up to three batch dimensions with
// their own strides (0 broadcasts), so transposed views and broadcast batches need no
// copies. Accumulation is PGK_ACC: float for float/half/bf16, double for double, and a
// 64-bit (or 32-bit) integer for integer types, cast back to the output type at the end
// (wrap-around like NumPy's integer matmul).
// 64x64 output tile per block of 256 threads (4x4 outputs a thread), K in slabs of 16
// through shared memory.
#include "common.cuh"

#ifndef PGK_TO
#define PGK_TO PGK_T
#endif
typedef PGK_TO pgk_to;

#define PGK_BM 64
#define PGK_BN 64
#define PGK_BK 16

template <typename T> PGK_DEVICE pgk_acc pgk_mm_in(T v) {
  if constexpr (sizeof(T) == 2) return (pgk_acc)pgk_to_float(v);  // half or bf16
  else return (pgk_acc)v;
}
template <typename O> PGK_DEVICE O pgk_mm_out(pgk_acc v) {
  if constexpr (sizeof(O) == 2) return pgk_from_float<O>((float)v);
  else return (O)v;
}


extern "C" __global__ void __launch_bounds__(256)
    pgk_matmul(const pgk_t* __restrict__ a, const pgk_t* __restrict__ b,
               pgk_to* __restrict__ c, int m, int n, int k, int nb1, int nb2,
               long long a_rs, long long a_cs, long long b_rs, long long b_cs, long long c_rs,
               long long c_cs, long long a_b0, long long a_b1, long long a_b2, long long b_b0,
               long long b_b1, long long b_b2, long long c_b0, long long c_b1, long long c_b2) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  // +1 column of padding: the transposed store of A and the row reads of B stay free of
  // bank conflicts for 4- and 8-byte types alike.
  __shared__ pgk_acc As[PGK_BK][PGK_BM + 1];
  __shared__ pgk_acc Bs[PGK_BK][PGK_BN + 1];
  const int z = blockIdx.z;
  const int z2 = z % nb2, z1 = (z / nb2) % nb1, z0 = z / (nb2 * nb1);
  a += z0 * a_b0 + z1 * a_b1 + z2 * a_b2;
  b += z0 * b_b0 + z1 * b_b1 + z2 * b_b2;
  c += z0 * c_b0 + z1 * c_b1 + z2 * c_b2;
  const int row0 = blockIdx.y * PGK_BM, col0 = blockIdx.x * PGK_BN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  pgk_acc acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0;

  for (int k0 = 0; k0 < k; k0 += PGK_BK) {
    // 64x16 elements of each operand: 4 per thread.
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int e = threadIdx.x + l * 256;
      const int ar = e / PGK_BK, ak = e % PGK_BK;  // A: consecutive threads walk K
      const int gr = row0 + ar, gk = k0 + ak;
      As[ak][ar] = (gr < m && gk < k) ? pgk_mm_in(a[gr * a_rs + gk * a_cs]) : pgk_acc(0);
      const int bk = e / PGK_BN, bc = e % PGK_BN;  // B: consecutive threads walk N
      const int hk = k0 + bk, hc = col0 + bc;
      Bs[bk][bc] = (hk < k && hc < n) ? pgk_mm_in(b[hk * b_rs + hc * b_cs]) : pgk_acc(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < PGK_BK; ++kk) {
      pgk_acc av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = row0 + ty + 16 * i;
    if (r >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int cc = col0 + tx + 16 * j;
      if (cc < n) c[r * c_rs + cc * c_cs] = pgk_mm_out<pgk_to>(acc[i][j]);
    }
  }
}
