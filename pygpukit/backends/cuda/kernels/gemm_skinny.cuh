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
// PGK_SALIGN 0: x or W not 16-byte aligned at run time; their pieces are loaded element by
// element instead of cp.async (the launcher picks the variant per call).
//
// PGK_SQ8 1: W is int8 [N, K] with a float32 scale per row (ir/quant.py's int8 layout; the
// weight-only w8a16 of batched decode). Its stages arrive as bytes, half of a bf16 stage
// (16-byte pieces XOR-swizzled by row pair), and each lane reads the four bytes of its B
// fragment (two 2-byte loads) and decodes them exactly in registers (pgk_qint8_pairs:
// integer and fp32 arithmetic, no conversion instructions); the row's scale multiplies
// the summed tile in fp32. (Decoding each stage into a bf16 stage for ldmatrix, a second
// barrier a stage, measured slower.)
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
#ifndef PGK_SQ8
#define PGK_SQ8 0
#endif
#if PGK_SQ8
#include "quant_format.cuh"
typedef unsigned char pgk_sw_t;  // W's element as stored
#else
typedef pgk_t pgk_sw_t;
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

// Byte offset of 16-byte piece `c` (0-3) of row `r` in an int8 W's stage: swizzled by the
// row pair, so a fragment's eight rows (64 bytes apart) fall in distinct banks.
PGK_DEVICE int pgk_soff8(int r, int c) { return r * PGK_SBK + ((c ^ ((r >> 1) & 3)) << 4); }

// One 16-byte piece of an int8 W's stage (16 weights).
PGK_DEVICE void pgk_sload8(unsigned char* dst, const unsigned char* src, bool in) {
#if PGK_SALIGN
  pgk_cp_async16(dst, src, in);
#else
#pragma unroll
  for (int e = 0; e < 16; ++e) dst[e] = in ? src[e] : (unsigned char)0;
#endif
}

extern "C" __global__ void __launch_bounds__(128) PGK_SCLUSTER
    pgk_gemm_skinny(const pgk_t* __restrict__ x, const pgk_sw_t* __restrict__ w,
                    const float* __restrict__ scale, const pgk_t* __restrict__ bias,
                    pgk_t* __restrict__ y, const pgk_t* __restrict__ res, int m, int n, int k,
                    long long x_stride, long long w_stride, long long y_stride,
                    long long res_stride, int slice_stages, int w_early) {
  constexpr int SMT = PGK_SMT, NS = PGK_SST, XR = 16 * SMT;
  constexpr int WST = PGK_SBN * PGK_SBK, XST = XR * PGK_SBK;  // elements a stage
  constexpr int CLD = PGK_SBN + 4;  // fp32 tile row: +4 floats, rows in other banks
  static_assert(NS >= 2, "at least two stages");
  (void)scale;  // int8 W's row scales (PGK_SQ8)
  extern __shared__ __align__(128) unsigned char pgk_ssm[];
#if PGK_SQ8
  // W's stages (bytes), then x's.
  static_assert(NS * (WST + XST * 2) >= XR * CLD * 4, "the fp32 tile fits the stages");
  unsigned char* sw8 = pgk_ssm;
  pgk_t* sx = reinterpret_cast<pgk_t*>(pgk_ssm + NS * WST);
#else
  static_assert(NS * (WST + XST) * 2 >= XR * CLD * 4, "the fp32 tile fits the stages");
  pgk_t* sw = reinterpret_cast<pgk_t*>(pgk_ssm);
  pgk_t* sx = sw + NS * WST;
#endif
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;  // rows 32 warp .. + 31
  const int tile = blockIdx.x, slice = blockIdx.y;                // gridDim.y == PGK_SCL
  const int kst = (k + PGK_SBK - 1) / PGK_SBK;
  const int st0 = slice * slice_stages;
  const int nst = min(slice_stages, kst - st0);  // the host makes every slice non-empty

  // This thread's pieces of a stage: piece pc of rows lr + 16 i (W: i < 8, x: i < SMT);
  // an int8 W's rows are four pieces: piece wpc of rows wlr + 32 i (i < 4).
  const int pc = tid & 7, lr = tid >> 3;
  constexpr int WPR = PGK_SQ8 ? 4 : 8;  // 16-byte pieces of a W row in a stage
  const int wpc = tid % WPR, wlr = tid / WPR;
  constexpr int WRS = 128 / WPR;  // rows apart of one thread's pieces
  const pgk_sw_t* wrow[PGK_SBN / WRS];
#pragma unroll
  for (int i = 0; i < PGK_SBN / WRS; ++i) {
    const int row = tile * PGK_SBN + wlr + WRS * i;
    wrow[i] = row < n ? w + (long long)row * w_stride : nullptr;
  }
  auto issue_w = [&](int j) {
    const int col = (st0 + j) * PGK_SBK + wpc * (16 / (int)sizeof(pgk_sw_t));
#pragma unroll
    for (int i = 0; i < PGK_SBN / WRS; ++i) {
      const bool in = col < k && wrow[i] != nullptr;
#if PGK_SQ8
      pgk_sload8(sw8 + (j % NS) * WST + pgk_soff8(wlr + WRS * i, wpc), in ? wrow[i] + col : w, in);
#else
      pgk_sload(sw + (j % NS) * WST + pgk_soff(wlr + WRS * i, wpc), in ? wrow[i] + col : w, in);
#endif
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
#if PGK_SQ8
    const unsigned char* bw = sw8 + (j % NS) * WST;
#else
    const pgk_t* bw = sw + (j % NS) * WST;
#endif
    const pgk_t* bx = sx + (j % NS) * XST;
#pragma unroll
    for (int s = 0; s < PGK_SBK / 16; ++s) {
      unsigned a[SMT][4];
#pragma unroll
      for (int mt = 0; mt < SMT; ++mt)
        pgk_ldmatrix_x4(a[mt], bx + pgk_soff(16 * mt + (lane & 15), 2 * s + (lane >> 4)));
      unsigned b[2][4];  // n8 tiles 2p (b[p][0], b[p][1]) and 2p + 1 (b[p][2], b[p][3])
#if PGK_SQ8
#pragma unroll
      for (int t = 0; t < 4; ++t) {  // row qr of tile t: k 2qc, 2qc + 1 and 2qc + 8, 2qc + 9
        const unsigned char* e =
            bw + pgk_soff8(32 * warp + 8 * t + (lane >> 2), s) + 2 * (lane & 3);
        const unsigned lo = *reinterpret_cast<const unsigned short*>(e);
        const unsigned hi = *reinterpret_cast<const unsigned short*>(e + 8);
        pgk_qint8_pairs(lo | (hi << 16), b[t >> 1][(t & 1) * 2], b[t >> 1][(t & 1) * 2 + 1]);
      }
#else
#pragma unroll
      for (int p = 0; p < 2; ++p)
        pgk_ldmatrix_x4(b[p], bw + pgk_soff(32 * warp + 16 * p + (lane & 7) + ((lane >> 4) << 3),
                                            2 * s + ((lane >> 3) & 1)));
#endif
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
#if PGK_SQ8
      v *= scale[col];
#endif
      if (bias) v += pgk_to_float(bias[col]);
      v = pgk_epilogue_act(v);
      if (res) v += pgk_to_float(res[(long long)r * res_stride + col]);
      y[(long long)r * y_stride + col] = pgk_from_float<pgk_t>(v);
    }
  }
  pgk_cluster_sync();  // the peers' tiles stay in their shared memory until all have read
}
