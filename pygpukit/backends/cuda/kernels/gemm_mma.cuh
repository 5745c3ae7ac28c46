// Tensor-core GEMM for SM80+ (used when cuBLASLt is absent):
//   C[z] = act(A[z] @ B[z]^T + bias),  A [M, K] row-major, B [N, K] row-major (a linear
//   layer's weight), C [M, N] with row stride ldc; batch strides per operand (0 broadcasts).
// bf16 or f16 operands (PGK_T), fp32 accumulation through mma.sync m16n8k16, fragments
// loaded by ldmatrix, tiles staged by cp.async into two shared-memory buffers so the next
// K slab lands while the current one is multiplied. K must be a multiple of 8 and A/B
// 16-byte aligned (one cp.async moves 8 elements); M and N are arbitrary.
// PGK_ACT: 0 none, 1 GELU tanh, 2 GELU erf, 3 SiLU, applied after the bias.
#include "common.cuh"

#ifndef PGK_ACT
#define PGK_ACT 0
#endif

#define PGK_GBM 128
#define PGK_GBN 128
#define PGK_GBK 32
// Rows padded from 64 to 80 bytes: the 8 row addresses of each ldmatrix phase then fall in
// 8 distinct 16-byte bank groups.
#define PGK_GLD (PGK_GBK + 8)

// 256 threads = 8 warps in a 2 (M) x 4 (N) grid; each warp owns a 64x32 piece of the
// 128x128 block tile: 4 x 4 mma tiles, 64 fp32 accumulators a thread.
extern "C" __global__ void __launch_bounds__(256)
    pgk_gemm_mma(const pgk_t* __restrict__ a, const pgk_t* __restrict__ b,
                 const pgk_t* __restrict__ bias, pgk_t* __restrict__ c, int m, int n, int k,
                 long long lda, long long ldb, long long ldc, long long a_bs, long long b_bs,
                 long long c_bs) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  __shared__ __align__(16) pgk_t As[2][PGK_GBM * PGK_GLD];
  __shared__ __align__(16) pgk_t Bs[2][PGK_GBN * PGK_GLD];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const int row0 = blockIdx.y * PGK_GBM, col0 = blockIdx.x * PGK_GBN;
  a += blockIdx.z * a_bs;
  b += blockIdx.z * b_bs;
  c += blockIdx.z * c_bs;

  // Each thread copies 2 16-byte chunks of A and 2 of B per slab: 128 rows x 4 chunks.
  auto load_slab = [&](int kt, int stage) {
    const int kbase = kt * PGK_GBK;
#pragma unroll
    for (int l = 0; l < 2; ++l) {
      const int e = tid + l * 256;
      const int r = e >> 2, ch = (e & 3) * 8;
      const int gk = kbase + ch;
      const int ga = row0 + r, gb = col0 + r;
      const bool pa = ga < m && gk < k, pb = gb < n && gk < k;
      // Masked chunks still need a valid address; the matrix base is one.
      pgk_cp_async16(&As[stage][r * PGK_GLD + ch], pa ? a + ga * lda + gk : a, pa);
      pgk_cp_async16(&Bs[stage][r * PGK_GLD + ch], pb ? b + gb * ldb + gk : b, pb);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const int ktiles = (k + PGK_GBK - 1) / PGK_GBK;
  load_slab(0, 0);
  pgk_cp_async_commit();
  for (int kt = 0; kt < ktiles; ++kt) {
    if (kt + 1 < ktiles) load_slab(kt + 1, (kt + 1) & 1);
    pgk_cp_async_commit();  // empty group on the last slab keeps the wait count uniform
    pgk_cp_async_wait<1>();
    __syncthreads();
    const pgk_t* as = As[kt & 1];
    const pgk_t* bs = Bs[kt & 1];
#pragma unroll
    for (int kk = 0; kk < PGK_GBK; kk += 16) {
      unsigned af[4][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = warp_m * 64 + i * 16 + (lane & 15);
        pgk_ldmatrix_x4(af[i], as + r * PGK_GLD + kk + (lane >> 4) * 8);
      }
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        const int r = warp_n * 32 + j * 8 + (lane & 7) + (lane >> 4) * 8;
        unsigned t[4];
        pgk_ldmatrix_x4(t, bs + r * PGK_GLD + kk + ((lane >> 3) & 1) * 8);
        bf[j][0] = t[0];
        bf[j][1] = t[1];
        bf[j + 1][0] = t[2];
        bf[j + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) pgk_mma_16816(acc[i][j], af[i], bf[j]);
    }
    __syncthreads();  // the next iteration's cp.async overwrites the buffer just read
  }

#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row0 + warp_m * 64 + i * 16 + (lane >> 2) + (e >> 1) * 8;
        const int cc = col0 + warp_n * 32 + j * 8 + (lane & 3) * 2 + (e & 1);
        if (r < m && cc < n) {
          float v = acc[i][j][e];
          if (bias) v += pgk_to_float(bias[cc]);
          c[r * ldc + cc] = pgk_from_float<pgk_t>(pgk_epilogue_act(v));
        }
      }
}
