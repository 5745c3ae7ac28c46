// Skinny GEMM for batched decode on Hopper (SM 9.0a: wgmma, the bulk tensor copy engine),
// bf16 / fp16: y [M, N] = x [M, K] W^T (+ res) with W [N, K] row-major, fp32 accumulate,
// for a few dozen token rows (M up to PGK_SN <= 128): every byte of W is read once, so
// the kernel is bound by the weight stream, and cuBLASLt's tiles (built for large M)
// read it at ~60% of copy bandwidth on the decode step's shapes.
//
// The roles swap: W's rows are wgmma's M (64 a consumer warpgroup), the token rows its N
// (PGK_SN, M rounded up; rows past M are zero-filled by the copy engine and never
// stored). K streams through PGK_SSTAGES stages of one 64-column panel each (128 bytes a
// row, the 128-byte swizzle wgmma's descriptors read): W's 64-row boxes and x's PGK_SN-row
// box land on a full barrier (complete_tx); the consumers arrive on the stage's empty
// barrier once the wgmma reading it has retired. One producer warp (its lane 0) issues
// the copies; with w_early (read-only weights in a captured graph) it issues the first
// stages' W copies before the programmatic-launch wait (see common.cuh): only x, res and
// y depend on the kernel ahead.
//
// Split K: blockIdx.x = split * tiles + tile; each split takes a contiguous share of the
// panels. With more than one split every block stores its fp32 partial (fragment order,
// coalesced) to ws and counts itself on its tile's counter; the block that arrives last
// reads the splits' partials back (all of a split's loads in flight: a load-add chain
// measured 3-6x slower than cuBLASLt), sums them in split order (deterministic: the same
// bits whichever block arrives last), applies the epilogue and stores y. atomicInc leaves
// the counter zeroed.
//
// PGK_SCL > 1: the splits are one thread-block cluster of PGK_SCL blocks (blockIdx.x =
// tile * PGK_SCL + split) and reduce through distributed shared memory instead: each block
// leaves its partial in its own shared memory, and after a cluster barrier block r sums
// (in split order) the fragment registers i with i % PGK_SCL == r from every block of the
// cluster and stores them; a second barrier keeps the partials until all are read. No
// workspace, no counters, no round trip through L2.
//
// PGK_SGLU 1 (SwiGLU epilogue, two consumer warpgroups): W's first N/2 rows are the gate,
// the rest the up projection (gemv.cuh's PGK_GLU layout); warpgroup 0 takes gate rows
// n0 .. n0 + 63, warpgroup 1 the up rows of the same outputs, and y [M, N/2] gets
// silu(gate) * up (+ res) from the two accumulators (same fragment positions, exchanged
// through shared memory).
#include "common.cuh"
#include "sm90.cuh"

#ifndef PGK_SN
#define PGK_SN 64  // token rows a block (wgmma N: 32, 64 or 128)
#endif
#ifndef PGK_SWG
#define PGK_SWG 1  // consumer warpgroups (64 W rows each)
#endif
#ifndef PGK_SSTAGES
#define PGK_SSTAGES 6
#endif
#ifndef PGK_SGLU
#define PGK_SGLU 0
#endif
#ifndef PGK_SCL
#define PGK_SCL 1  // blocks of a cluster (K splits reduced in shared memory); 1: none
#endif
#define PGK_SCT (128 * PGK_SWG)               // consumer threads
#define PGK_ST (PGK_SCT + 32)                 // + the producer warp
#define PGK_SWB (8192 * PGK_SWG)              // bytes of W a stage (64 rows x 128 bytes each)
#define PGK_SXB (PGK_SN * 128)                // bytes of x a stage
#define PGK_SSTAGE (PGK_SWB + PGK_SXB)
#define PGK_SOUT (PGK_SGLU ? 64 : 64 * PGK_SWG)  // output columns (of y) a tile
#define PGK_SACC (PGK_SN / 2)                 // accumulator registers a thread

static_assert(sizeof(pgk_t) == 2, "skinny_sm90 takes bf16 or f16");
static_assert(PGK_SN == 32 || PGK_SN == 64 || PGK_SN == 128, "32, 64 or 128 token rows");
static_assert(PGK_SWG == 1 || PGK_SWG == 2, "one or two consumer warpgroups");
static_assert(!PGK_SGLU || PGK_SWG == 2, "SwiGLU takes two warpgroups: gate and up");
static_assert(PGK_SSTAGES >= 2, "at least two stages");
static_assert(PGK_SCL == 1 || PGK_SCL == 2 || PGK_SCL == 4 || PGK_SCL == 8, "cluster of 1-8");


template <int N> PGK_DEVICE void pgk_skinny_mma(float* d, unsigned long long a,
                                                 unsigned long long b) {
  if constexpr (N == 32)
    pgk_wgmma_ss32(d, a, b, 1);
  else if constexpr (N == 64)
    pgk_wgmma_ss64(d, a, b, 1);
  else
    pgk_wgmma_ss128(d, a, b, 1);
}

// Named barrier 1 over the consumer threads (the producer warp has returned).
PGK_DEVICE void pgk_skinny_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(PGK_SCT) : "memory");
}

// Every thread of the cluster arrives (release) and waits (acquire).
PGK_DEVICE void pgk_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The float at shared address `addr` of cluster block `rank`.
PGK_DEVICE float pgk_cluster_ld(unsigned addr, int rank) {
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// Stores fragment register i (value v) of a consumer thread (row0: its first W row) with
// the residual: register j * 4 + e holds W row row0 (+ 8 for e >= 2) and token row
// 8 * j + 2 * (lane % 4) + e % 2 (the m64nNk16 accumulator layout).
PGK_DEVICE void pgk_skinny_store(pgk_t* __restrict__ y, const pgk_t* __restrict__ res,
                                 long long y_stride, long long res_stride, int m, int n_out,
                                 int row0, int lane, int i, float v) {
  const int row = row0 + 8 * ((i & 3) >> 1), t = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
  if (row < n_out && t < m) {
    if (res) v += pgk_to_float(res[t * res_stride + row]);
    y[t * y_stride + row] = pgk_from_float<pgk_t>(v);
  }
}

// A cluster of one block where PGK_SCL is 1 (the global-memory splits).
extern "C" __global__ void __cluster_dims__(PGK_SCL, 1, 1) __launch_bounds__(PGK_ST)
    pgk_skinny_sm90(const __grid_constant__ pgk_tmap tm_w, const __grid_constant__ pgk_tmap tm_x,
                    pgk_t* __restrict__ y, const pgk_t* __restrict__ res, long long y_stride,
                    long long res_stride, float* __restrict__ ws,
                    unsigned* __restrict__ counters, int m, int n, int k, int splits,
                    int w_early) {
  __shared__ __align__(8) unsigned long long bar_f[PGK_SSTAGES], bar_e[PGK_SSTAGES];
  __shared__ int last_flag;
  extern __shared__ __align__(16) unsigned char pgk_ssmem_raw[];
  // The swizzle is a function of the address: every stage starts 1024-byte aligned (the
  // launcher asks for 1 KB of slack).
  unsigned char* smem = pgk_ssmem_raw + ((1024 - (pgk_hsmem(pgk_ssmem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x;
  const int n_out = PGK_SGLU ? n / 2 : n;
  const int tiles = (n_out + PGK_SOUT - 1) / PGK_SOUT;
#if PGK_SCL > 1
  const int tile = (int)(blockIdx.x / PGK_SCL), split = (int)(blockIdx.x % PGK_SCL);
#else
  const int tile = (int)(blockIdx.x % tiles), split = (int)(blockIdx.x / tiles);
#endif
  const int panels = (k + 63) / 64;
  const int p0 = (int)((long long)panels * split / splits);
  const int np = (int)((long long)panels * (split + 1) / splits) - p0;
  const int n0 = tile * PGK_SOUT;

  if (tid == 0) {
    for (int s = 0; s < PGK_SSTAGES; ++s) {
      pgk_hbar_init(&bar_f[s], 1);
      pgk_hbar_init(&bar_e[s], PGK_SCT);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (tid >= PGK_SCT) {
    // The producer warp: lane 0 issues every copy (in a cluster the warp stays for the
    // cluster barriers).
    if (tid != PGK_SCT) {
      if (PGK_SCL > 1) pgk_cluster_sync(), pgk_cluster_sync();
      return;
    }
    auto load_w = [&](int i) {
      unsigned char* st = smem + (i % PGK_SSTAGES) * PGK_SSTAGE;
#pragma unroll
      for (int c = 0; c < PGK_SWG; ++c)
        pgk_htma2(st + c * 8192, &tm_w, (p0 + i) * 64,
                  PGK_SGLU ? c * (n / 2) + n0 : n0 + 64 * c, &bar_f[i % PGK_SSTAGES]);
    };
    auto load_x = [&](int i) {
      pgk_htma2(smem + (i % PGK_SSTAGES) * PGK_SSTAGE + PGK_SWB, &tm_x, (p0 + i) * 64, 0,
                &bar_f[i % PGK_SSTAGES]);
    };
    const int pre = w_early ? min(PGK_SSTAGES, np) : 0;
    for (int i = 0; i < pre; ++i) {
      pgk_hbar_expect(&bar_f[i], PGK_SSTAGE);
      load_w(i);
    }
    pgk_pdl_wait();  // x is the kernel ahead's output
    pgk_pdl_trigger();
    for (int i = 0; i < pre; ++i) load_x(i);
    for (int i = pre; i < np; ++i) {
      const int s = i % PGK_SSTAGES;
      // The stage's previous panel is done with (a fresh barrier passes parity 1 at once).
      pgk_hbar_wait(&bar_e[s], ((i / PGK_SSTAGES) & 1) ^ 1);
      pgk_hbar_expect(&bar_f[s], PGK_SSTAGE);
      load_w(i);
      load_x(i);
    }
    if (PGK_SCL > 1) pgk_cluster_sync(), pgk_cluster_sync();
    return;
  }

  pgk_pdl_wait();  // res and y (and ws / counters, reused by the kernel ahead's splits)
  pgk_pdl_trigger();
  const int c = tid >> 7, warp = (tid & 127) >> 5, lane = tid & 31;
  const unsigned base = pgk_hsmem(smem);
  float acc[PGK_SACC];
#pragma unroll
  for (int i = 0; i < PGK_SACC; ++i) acc[i] = 0.0f;

  for (int i = 0; i < np; ++i) {
    const int s = i % PGK_SSTAGES;
    pgk_hbar_wait(&bar_f[s], (i / PGK_SSTAGES) & 1);
    const unsigned wa = base + s * PGK_SSTAGE + c * 8192, xa = base + s * PGK_SSTAGE + PGK_SWB;
    pgk_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // 16 columns a step: 32 bytes into a swizzled row
      pgk_skinny_mma<PGK_SN>(acc, pgk_hdesc(wa + kk * 32, 16, 1024),
                             pgk_hdesc(xa + kk * 32, 16, 1024));
    pgk_wg_commit();
    // The previous panel's wgmma has retired: its stage may be refilled.
    pgk_wg_wait1();
    if (i > 0) pgk_hbar_arrive(&bar_e[(i - 1) % PGK_SSTAGES]);
  }
  pgk_wg_wait0();
  pgk_wg_hold<PGK_SACC>(acc);
  const int row0 = n0 + 64 * (PGK_SGLU ? 0 : c) + 16 * warp + (lane >> 2);

#if PGK_SCL > 1
  // Every copy has landed and been read by every consumer warp: the stages hold this
  // block's partial now.
  float* part = reinterpret_cast<float*>(smem);
  pgk_skinny_sync();
#pragma unroll
  for (int i = 0; i < PGK_SACC; ++i) part[i * PGK_SCT + tid] = acc[i];
  pgk_cluster_sync();
  if (!PGK_SGLU || c == 0) {
    const unsigned pa = pgk_hsmem(part) + 4u * tid;
    for (int i = split; i < PGK_SACC; i += PGK_SCL) {
      float v[PGK_SCL], u[PGK_SCL];
#pragma unroll
      for (int r = 0; r < PGK_SCL; ++r) {
        v[r] = pgk_cluster_ld(pa + 4u * i * PGK_SCT, r);
        if (PGK_SGLU) u[r] = pgk_cluster_ld(pa + 4u * (i * PGK_SCT + 128), r);
      }
      float g = 0.0f, up = 0.0f;
#pragma unroll
      for (int r = 0; r < PGK_SCL; ++r) {
        g += v[r];
        if (PGK_SGLU) up += u[r];
      }
      if (PGK_SGLU) g = g / (1.0f + __expf(-g)) * up;
      pgk_skinny_store(y, res, y_stride, res_stride, m, n_out, row0, lane, i, g);
    }
  }
  pgk_cluster_sync();  // the partials stay until every block of the cluster has read them
  return;
#endif

  if (splits > 1) {
    const long long block_floats = (long long)PGK_SACC * PGK_SCT;
#pragma unroll
    for (int j = 0; j < PGK_SACC; ++j)
      ws[(long long)blockIdx.x * block_floats + j * PGK_SCT + tid] = acc[j];
    __threadfence();  // this thread's partial reaches L2 before the block is counted
    pgk_skinny_sync();
    if (tid == 0) {
      last_flag = atomicInc(counters + tile, (unsigned)(splits - 1)) == (unsigned)(splits - 1);
      __threadfence();  // acquire: the reads below see every other split's partial
    }
    pgk_skinny_sync();
    if (!last_flag) return;
    // Every split's partial from L2 (this block's own too: the same bits as acc), two
    // splits' loads in flight at once, summed in split order.
    const float* src = ws + (long long)tile * block_floats + tid;
    const long long split_floats = (long long)tiles * block_floats;
#pragma unroll
    for (int j = 0; j < PGK_SACC; ++j) acc[j] = 0.0f;
    for (int sp = 0; sp < splits; sp += 2) {
      float a[PGK_SACC], b[PGK_SACC];
      const bool two = sp + 1 < splits;
#pragma unroll
      for (int j = 0; j < PGK_SACC; ++j) {
        a[j] = __ldcg(src + sp * split_floats + j * PGK_SCT);
        b[j] = two ? __ldcg(src + (sp + 1) * split_floats + j * PGK_SCT) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < PGK_SACC; ++j) acc[j] = acc[j] + a[j] + b[j];
    }
  }

#if PGK_SGLU
  // The up warpgroup hands its sums to the gate warpgroup's threads of the same position.
  float* up = reinterpret_cast<float*>(smem);
  pgk_skinny_sync();  // every stage has been read (the copies all landed and retired)
  if (c == 1) {
#pragma unroll
    for (int j = 0; j < PGK_SACC; ++j) up[j * 128 + (tid & 127)] = acc[j];
  }
  pgk_skinny_sync();
  if (c == 1) return;
#pragma unroll
  for (int j = 0; j < PGK_SACC; ++j) {
    const float g = acc[j];
    acc[j] = g / (1.0f + __expf(-g)) * up[j * 128 + tid];
  }
#endif
#pragma unroll
  for (int i = 0; i < PGK_SACC; ++i)
    pgk_skinny_store(y, res, y_stride, res_stride, m, n_out, row0, lane, i, acc[i]);
}
