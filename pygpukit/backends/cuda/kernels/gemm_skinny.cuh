// Skinny GEMM for batched decode: y[m, n] = epilogue(sum_k x[m, k] * W[n, k]) for up to 64
// rows m of bf16/f16 x against a weight W [N, K] (K-contiguous rows), the rows a decode
// step of a few dozen sequences multiplies. W is read once, every SM streams it.
//
// A block owns 128 rows of W (a tile) and a slice of K (whole 64-column stages); its four
// warps own 32 rows of W each. x is mma.sync m16n8k16's A operand (PGK_SMT m16 tiles of
// rows) and W its B operand (n8 tiles), both staged through shared memory by cp.async in
// PGK_SST stages and read by ldmatrix (16-byte pieces XOR-swizzled by row, so the eight
// rows of a phase fall in distinct banks). Decode shapes have few tiles (2048 -> 2560: 20),
// so K is split over blockIdx.y until the grid fills the SMs (split-K): the PGK_SCL blocks
// of a tile form a thread-block cluster and sum their fp32 tiles through distributed
// shared memory (SM 9.0), each block a share of the outputs: one launch, no workspace.
// (A last-block-sums reduction through a global workspace left that block reading every
// slice's partial in turn: 2.5x slower than cuBLASLt at 64 rows on an H200.)
//
// With w_early (read-only weights in a captured graph) the first stages of W are issued
// before the programmatic-dependent-launch wait, so the weight stream starts while the
// kernel ahead still runs; x and y are touched only after it.
// Epilogue in fp32 from the summed tile: + bias, PGK_ACT (see common.cuh), + residual.
// PGK_SALIGN 0: x or W not 16-byte aligned at run time; their pieces are loaded as 2-byte
// elements instead of cp.async (the launcher picks the variant per call).
#include "common.cuh"

#ifndef PGK_SMT
#define PGK_SMT 4  // m16 tiles of x's rows: 16 * PGK_SMT >= m
#endif
#ifndef PGK_SST
#define PGK_SST 4  // pipeline stages (>= 2)
#endif
#ifndef PGK_ACT
#define PGK_ACT 0
#endif
#ifndef PGK_SALIGN
#define PGK_SALIGN 1
#endif

#ifndef PGK_SCL
#define PGK_SCL 1  // K slices: the blocks of a cluster (1, 2, 4, 8)
#endif

#define PGK_SBN 128  // rows of W a block
#define PGK_SBK 64   // columns of K a stage: a row of a stage is 128 bytes, 8 pieces

// Split K over a thread-block cluster of PGK_SCL blocks (SM 9.0; 1 elsewhere: the
// launcher splits only where clusters exist): each block's fp32 tile is read by its peers
// through distributed shared memory, no workspace in global memory.
#if PGK_SCL > 1 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PGK_SDSMEM 1  // this build splits K over a cluster
#define PGK_SCLUSTER __cluster_dims__(1, PGK_SCL, 1)
#else
#define PGK_SDSMEM 0
#define PGK_SCLUSTER
#endif

PGK_DEVICE void pgk_cluster_sync() {
#if PGK_SDSMEM
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
#else
  __syncthreads();
#endif
}

// The float4 at p of this block's tile summed over the cluster's tiles, in rank order.
PGK_DEVICE float4 pgk_ssum(const float* p) {
#if PGK_SDSMEM
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  float4 v[PGK_SCL];
#pragma unroll
  for (int o = 0; o < PGK_SCL; ++o) {
    unsigned d;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(s), "r"(o));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v[o].x), "=f"(v[o].y), "=f"(v[o].z), "=f"(v[o].w)
                 : "r"(d)
                 : "memory");
  }
  float4 t = v[0];
#pragma unroll
  for (int o = 1; o < PGK_SCL; ++o) {
    t.x += v[o].x;
    t.y += v[o].y;
    t.z += v[o].z;
    t.w += v[o].w;
  }
  return t;
#elif PGK_SCL > 1
  (void)p;
  __trap();  // never launched: clusters need SM 9.0
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#else
  return *reinterpret_cast<const float4*>(p);
#endif
}

// Element offset of 16-byte piece `c` (0-7) of row `r` in a stage: swizzled by the row.
PGK_DEVICE int pgk_soff(int r, int c) { return r * PGK_SBK + ((c ^ (r & 7)) << 3); }

// One 16-byte piece into shared memory: cp.async, or (PGK_SALIGN 0) eight element loads.
PGK_DEVICE void pgk_sload(pgk_t* dst, const pgk_t* src, bool in) {
#if PGK_SALIGN
  pgk_cp_async16(dst, src, in);
#else
#pragma unroll
  for (int e = 0; e < 8; ++e) dst[e] = in ? src[e] : pgk_from_float<pgk_t>(0.0f);
#endif
}

extern "C" __global__ void __launch_bounds__(128) PGK_SCLUSTER
    pgk_gemm_skinny(const pgk_t* __restrict__ x, const pgk_t* __restrict__ w,
                    const pgk_t* __restrict__ bias, pgk_t* __restrict__ y,
                    const pgk_t* __restrict__ res, int m, int n, int k, long long x_stride,
                    long long w_stride, long long y_stride, long long res_stride, int slice_stages,
                    int w_early) {
  constexpr int SMT = PGK_SMT, NS = PGK_SST, XR = 16 * SMT;
  constexpr int WST = PGK_SBN * PGK_SBK, XST = XR * PGK_SBK;  // elements a stage
  constexpr int CLD = PGK_SBN + 4;  // fp32 tile row: +4 floats, rows in other banks
  static_assert(NS >= 2, "at least two stages");
  static_assert(NS * (WST + XST) * 2 >= XR * CLD * 4, "the fp32 tile fits the stages");
  extern __shared__ __align__(128) unsigned char pgk_ssm[];
  pgk_t* sw = reinterpret_cast<pgk_t*>(pgk_ssm);
  pgk_t* sx = sw + NS * WST;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;  // rows 32 warp .. + 31
  const int tile = blockIdx.x, slice = blockIdx.y;                // gridDim.y == PGK_SCL
  const int kst = (k + PGK_SBK - 1) / PGK_SBK;
  const int st0 = slice * slice_stages;
  const int nst = min(slice_stages, kst - st0);  // the host makes every slice non-empty

  // This thread's pieces of a stage: piece pc of rows lr + 16 i (W: i < 8, x: i < SMT).
  const int pc = tid & 7, lr = tid >> 3;
  const pgk_t* wrow[PGK_SBN / 16];
#pragma unroll
  for (int i = 0; i < PGK_SBN / 16; ++i) {
    const int row = tile * PGK_SBN + lr + 16 * i;
    wrow[i] = row < n ? w + (long long)row * w_stride : nullptr;
  }
  auto issue_w = [&](int j) {
    pgk_t* b = sw + (j % NS) * WST;
    const int col = (st0 + j) * PGK_SBK + pc * 8;
#pragma unroll
    for (int i = 0; i < PGK_SBN / 16; ++i) {
      const bool in = col < k && wrow[i] != nullptr;
      pgk_sload(b + pgk_soff(lr + 16 * i, pc), in ? wrow[i] + col : w, in);
    }
  };
  auto issue_x = [&](int j) {
    pgk_t* b = sx + (j % NS) * XST;
    const int col = (st0 + j) * PGK_SBK + pc * 8;
#pragma unroll
    for (int i = 0; i < SMT; ++i) {
      const int r = lr + 16 * i;
      const bool in = col < k && r < m;
      pgk_sload(b + pgk_soff(r, pc), in ? x + (long long)r * x_stride + col : x, in);
    }
  };

  // Prologue: stages 0 .. NS-2, one commit group each (W of them all in the first group
  // when it is loaded before the wait).
  const int pre = min(NS - 1, nst);
  if (w_early)
    for (int j = 0; j < pre; ++j) issue_w(j);
  pgk_pdl_wait();
  pgk_pdl_trigger();
  for (int j = 0; j < NS - 1; ++j) {
    if (j < pre) {
      if (!w_early) issue_w(j);
      issue_x(j);
    }
    pgk_cp_async_commit();
  }

  float acc[SMT][4][4];
#pragma unroll
  for (int a = 0; a < SMT; ++a)
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][t][e] = 0.0f;

  for (int j = 0; j < nst; ++j) {
    pgk_cp_async_wait<NS - 2>();  // stage j has landed (one group a stage, in order)
    __syncthreads();              // and every warp is done with the buffer refilled below
    if (j + NS - 1 < nst) {
      issue_w(j + NS - 1);
      issue_x(j + NS - 1);
    }
    pgk_cp_async_commit();
    const pgk_t* bw = sw + (j % NS) * WST;
    const pgk_t* bx = sx + (j % NS) * XST;
#pragma unroll
    for (int s = 0; s < PGK_SBK / 16; ++s) {
      unsigned a[SMT][4];
#pragma unroll
      for (int mt = 0; mt < SMT; ++mt)
        pgk_ldmatrix_x4(a[mt], bx + pgk_soff(16 * mt + (lane & 15), 2 * s + (lane >> 4)));
      unsigned b[2][4];  // n8 tiles 2p (b[p][0], b[p][1]) and 2p + 1 (b[p][2], b[p][3])
#pragma unroll
      for (int p = 0; p < 2; ++p)
        pgk_ldmatrix_x4(b[p], bw + pgk_soff(32 * warp + 16 * p + (lane & 7) + ((lane >> 4) << 3),
                                            2 * s + ((lane >> 3) & 1)));
#pragma unroll
      for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
        for (int t = 0; t < 4; ++t) pgk_mma_16816(acc[mt][t], a[mt], b[t >> 1] + (t & 1) * 2);
    }
  }
  pgk_cp_async_wait<0>();
  __syncthreads();  // the stages are free: the fp32 tile takes their place

  // The tile's sums, ct[row of x][row of W in the tile].
  float* ct = reinterpret_cast<float*>(pgk_ssm);
  const int qr = lane >> 2, qc = lane & 3;
#pragma unroll
  for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 32 * warp + 8 * t + 2 * qc, row = 16 * mt + qr + 8 * h;
        *reinterpret_cast<float2*>(ct + row * CLD + col) =
            make_float2(acc[mt][t][2 * h], acc[mt][t][2 * h + 1]);
      }
  __syncthreads();

  // Split K: the cluster's blocks are the tile's slices; after the barrier each takes
  // every PGK_SCL-th group of four outputs and sums the slices' tiles there, in slice order
  // (the result does not depend on which block sums), reading its peers' shared memory.
  pgk_cluster_sync();
  // Epilogue, four outputs (one float4 of each summed row) at a time.
  for (int i = slice * 128 + tid; i < m * (PGK_SBN / 4); i += PGK_SCL * 128) {
    const int r = i / (PGK_SBN / 4), c = (i % (PGK_SBN / 4)) * 4;
    const float4 a = pgk_ssum(ct + r * CLD + c);
    const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = tile * PGK_SBN + c + e;
      if (col >= n) break;
      float v = av[e];
      if (bias) v += pgk_to_float(bias[col]);
      v = pgk_epilogue_act(v);
      if (res) v += pgk_to_float(res[(long long)r * res_stride + col]);
      y[(long long)r * y_stride + col] = pgk_from_float<pgk_t>(v);
    }
  }
  pgk_cluster_sync();  // the peers' tiles stay in their shared memory until all have read
}
