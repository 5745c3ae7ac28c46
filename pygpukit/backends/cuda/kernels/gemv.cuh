// GEMV for decode: y[m, n] = act(sum_k x[m, k] * W[n, k] + bias[n]), W row-major [N, K],
// for a few rows m of x (batched decode), reading W once for all of them.
// PGK_ACT: 0 none, 1 GELU tanh, 2 GELU erf, 3 SiLU (pgk_epilogue_act, common.cuh), after the bias.
//
// pgk_gemv_mma (bf16/f16, 16-byte aligned rows, K % 8 == 0): up to 16 rows of x are the
// M = 16 rows of mma.sync m16n8k16 tiles and 8 rows of W the N = 8 columns, so the kernel
// costs the same whether M is 1 or 16. A block owns 8 * PGK_NT rows of W; its PGK_GW warps
// split K into contiguous ranges and each lane issues PGK_NT * PGK_U 16-byte loads of W
// before the first multiply (bandwidth-bound code on Hopper needs ~40 KB in flight per SM,
// and a warp walking a whole row alone had too few: 58-74% of copy bandwidth). The
// partial sums of the warps meet once in shared memory at the end.
//
// K is permuted inside each 16-wide mma step so every lane reads 8 consecutive elements
// (one 16-byte load) instead of the fragment layout's 2+2: the thread of fragment column
// pair c holds physical columns 8c .. 8c+7 of a 32-column chunk, and the A fragment (x)
// uses the same permutation, so the dot products are unchanged.
//
// Folded neighbours (passes/fold_into_linear.py), tensor-core kernel only:
// PGK_PRO 1: RMSNorm prologue. x enters the MMA as x * gain (one packed multiply per
//   two elements: the exact product rounded once, as in float32), and the row's 1/rms
//   scales its sum before the bias: no extra pass over x. The sums of squares come from
//   the tensor cores too: one more MMA per chunk with raw x as both operands puts x_i . x_i
//   on the diagonal of its tile. (Converting, squaring and adding each element on the
//   CUDA cores, redone by every block, made the kernel issue-bound: 2048 -> 11264 took
//   20.7 us against 14.2 without the prologue.)
//   (A SwiGLU prologue the same way was compute-bound -- an exp and a divide per x
//   element, redone by every block for all 16 row slots -- so SwiGLU stays its own kernel.)
// res (optional): a residual [M, N] added after the activation.
// PGK_GLU 1: SwiGLU epilogue. W's first N/2 rows are the gate, the rest the up projection;
//   a block's first NT/2 n8 tiles take gate rows and the others the up rows of the same
//   outputs, so y[m, j] = silu(gate_j) * up_j (plus bias before, residual after) is
//   written straight from the block's sums: y has N/2 columns, and the decode step loses
//   a kernel and a round trip of the gate/up activations per layer.
//
// pgk_gemv (any float type, any alignment): one warp per output row, grid.y walks the
// rows of x; the fallback for float32 and for unaligned views.
#include "common.cuh"

#ifndef PGK_UNROLL
#define PGK_UNROLL 4
#endif
#ifndef PGK_WARPS
#define PGK_WARPS 8
#endif
#ifndef PGK_ACT
#define PGK_ACT 0
#endif
#ifndef PGK_GW
#define PGK_GW 8
#endif
#ifndef PGK_NT
#define PGK_NT 1
#endif
#ifndef PGK_U
#define PGK_U 8
#endif
#ifndef PGK_PRO
#define PGK_PRO 0
#endif
#ifndef PGK_GSTAGES
#define PGK_GSTAGES 0
#endif
#ifndef PGK_GLU
#define PGK_GLU 0
#endif
#ifndef PGK_PF
#define PGK_PF 2  // slabs of W each warp pulls into L2 before waiting on its predecessor
#endif

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_gemv)
extern "C" __global__ void __launch_bounds__(PGK_WARPS * 32)
    pgk_gemv(const pgk_t* __restrict__ x, const pgk_t* __restrict__ w,
             const pgk_t* __restrict__ bias, pgk_t* __restrict__ y, int n, int k,
             long long x_stride, long long w_stride, long long y_stride) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  constexpr int V = PGK_VEC;
  constexpr int U = PGK_UNROLL;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * PGK_WARPS + (threadIdx.x >> 5);
  if (row >= n) return;
  const pgk_t* wr = w + (long long)row * w_stride;
  const pgk_t* xr = x + (long long)blockIdx.y * x_stride;
  pgk_acc acc = 0;
  const int nvec = k / V;
  int vi = lane;
  for (; vi + (U - 1) * 32 < nvec; vi += U * 32) {
    pgk_vec<pgk_t, V> wv[U], xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) wv[u] = pgk_load_stream<V>(wr + (long long)(vi + u * 32) * V);
#pragma unroll
    for (int u = 0; u < U; ++u) xv[u] = pgk_load<V>(xr + (long long)(vi + u * 32) * V);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) acc += pgk_acc_of(wv[u].v[e]) * pgk_acc_of(xv[u].v[e]);
  }
  for (; vi < nvec; vi += 32) {
    auto wv = pgk_load_stream<V>(wr + (long long)vi * V);
    auto xv = pgk_load<V>(xr + (long long)vi * V);
#pragma unroll
    for (int e = 0; e < V; ++e) acc += pgk_acc_of(wv.v[e]) * pgk_acc_of(xv.v[e]);
  }
  for (int e = nvec * V + lane; e < k; e += 32) acc += pgk_acc_of(wr[e]) * pgk_acc_of(xr[e]);
  acc = pgk_warp_sum(acc);
  if (lane == 0) {
    if (bias) acc += pgk_acc_of(bias[row]);
    y[(long long)blockIdx.y * y_stride + row] = pgk_from_acc<pgk_t>(pgk_epilogue_act(acc));
  }
}
#endif

// ------------------------------------------------------------------------------------------
// Tensor-core variant. grid (ceil(N / (8 * PGK_NT)), ceil(M / 16)), PGK_GW * 32 threads.
template <bool C, typename T, typename F>
struct pgk_gpick {
  using type = T;
};
template <typename T, typename F>
struct pgk_gpick<false, T, F> {
  using type = F;
};

PGK_DEVICE void pgk_gmma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                         unsigned b1) {
  if constexpr (pgk_same<pgk_t, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// W is streamed (read once: evict-first); x is re-read by every block, so it stays cached.
// (Making these volatile asm to keep all of a slab's x loads ahead of the MMAs made this
// path slower, 13.6 -> 15.2 us at 4096 x 4096: ptxas still placed them by use.)
PGK_DEVICE uint4 pgk_gload_w(const pgk_t* p, bool in) {
  return in ? __ldcs(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
}
PGK_DEVICE uint4 pgk_gload_x(const pgk_t* p, bool in) {
  return in ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
}

// x * gain on one 16-byte chunk of x (eight 2-byte elements), two at a time.
PGK_DEVICE uint4 pgk_gscale(uint4 xv, uint4 g) {
  using pair =
      typename pgk_gpick<pgk_same<pgk_t, __nv_bfloat16>::value, __nv_bfloat162, __half2>::type;
  uint4 out;
  const pair* xp = reinterpret_cast<const pair*>(&xv);
  const pair* gp = reinterpret_cast<const pair*>(&g);
  pair* op = reinterpret_cast<pair*>(&out);
#pragma unroll
  for (int e = 0; e < 4; ++e) op[e] = __hmul2(xp[e], gp[e]);
  return out;
}

// The prologue on one chunk: the sums of squares of the tile's rows accumulate on the
// diagonal of ss (raw x against itself; rows 8-15 in ss_hi when the upper half holds
// any), then x becomes x * gain for the main MMAs.
PGK_DEVICE void pgk_gprologue(uint4& xa, uint4& xb, uint4 g, bool upper, float (&ss)[4],
                              float (&ss_hi)[4]) {
#if PGK_PRO == 1
  pgk_gmma(ss, xa.x, xb.x, xa.y, xb.y, xa.x, xa.y);
  pgk_gmma(ss, xa.z, xb.z, xa.w, xb.w, xa.z, xa.w);
  if (upper) {
    pgk_gmma(ss_hi, xa.x, xb.x, xa.y, xb.y, xb.x, xb.y);
    pgk_gmma(ss_hi, xa.z, xb.z, xa.w, xb.w, xb.z, xb.w);
    xb = pgk_gscale(xb, g);
  }
  xa = pgk_gscale(xa, g);
#else
  (void)xa;
  (void)xb;
  (void)g;
  (void)upper;
  (void)ss;
  (void)ss_hi;
#endif
}

// One slab: U 32-column steps of x against NT n8 tiles of W; wget(u, t) gives W's
// fragment. (A function template, not a generic lambda: NVRTC 13.0 on the GPU machine
// takes an `auto` lambda parameter for a host function.)
template <int U, int NT, typename WGet>
PGK_DEVICE void pgk_gmma_slab(float (&acc)[NT][4], const uint4 (&xa)[U], const uint4 (&xb)[U],
                              WGet wget) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const uint4 wv = wget(u, t);
      pgk_gmma(acc[t], xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv.x, wv.y);
      pgk_gmma(acc[t], xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv.z, wv.w);
    }
}

// Row of W for row r (0 .. 8 * NT) of tile `tile`, or -1 past the end.
PGK_DEVICE int pgk_grow(int n, int r, int tile) {
#if PGK_GLU == 1
  constexpr int HALF = 4 * PGK_NT;  // outputs per tile: NT / 2 n8 tiles of gate, NT / 2 of up
  const int j = tile * HALF + r % HALF;
  return j < n / 2 ? (r < HALF ? j : n / 2 + j) : -1;
#else
  const int row = tile * 8 * PGK_NT + r;
  return row < n ? row : -1;
#endif
}

// A staged slab row is 32 * U columns, whole 128-byte lines (U >= 2). Odd rows swap the
// two 64-byte halves of each line, so the fragment reads of rows qr (even) and qr + 1
// (odd), which share an 8-lane phase, land in distinct banks without padding the rows:
// a fifth less shared memory, so two kernels' blocks fit on an SM (the persistent grid of
// w_early). (Padding instead measured the same or slower on an H200.)
PGK_DEVICE int pgk_gswz(int r, int piece) { return piece ^ ((r & 1) << 2); }

#if !defined(PGK_ONLY) || defined(PGK_ONLY_pgk_gemv_mma)
extern "C" __global__ void __launch_bounds__(PGK_GW * 32)
    pgk_gemv_mma(const pgk_t* __restrict__ x, const pgk_t* __restrict__ w,
                 const pgk_t* __restrict__ bias, pgk_t* __restrict__ y, int m, int n, int k,
                 long long x_stride, long long w_stride, long long y_stride,
                 const pgk_t* __restrict__ res, const pgk_t* __restrict__ pro, long long res_stride,
                 float eps, int x_rows, int w_early) {
  // Compiled into every module of the family, launched for 2-byte types only.
  constexpr int U = PGK_U, NT = PGK_NT;
  __shared__ float red[PGK_GW][16][8 * NT + 1];  // +1: lanes of a row land in distinct banks
#if PGK_PRO == 1
  __shared__ float sumsq[PGK_GW][16];
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int qr = lane >> 2, qc = lane & 3;
  const int m0 = blockIdx.y * 16;
  // A tile is 8 * NT rows of W (with GLU: 4 * NT outputs, gate and up rows). A grid
  // narrower than the tile count walks them (a persistent grid: one block per SM leaves
  // room beside it for the next kernel's blocks, which load their weights meanwhile).
  const int tiles = PGK_GLU ? (n / 2 + 4 * NT - 1) / (4 * NT) : (n + 8 * NT - 1) / (8 * NT);
  const int my_tiles = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  // This warp's contiguous range of 32-column chunks (balanced to within one chunk).
  const int nch = (k + 31) / 32;
  const int c_lo = (int)((long long)nch * warp / PGK_GW);
  const int c_hi = (int)((long long)nch * (warp + 1) / PGK_GW);
  const bool x0in = m0 + qr < m, x1in = m0 + qr + 8 < m;
  const bool upper = m0 + 8 < m;  // any row of x in the tile's upper half

  float acc[NT][4];
  float ss[4], ss_hi[4];
  auto zero_acc = [&]() {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) ss[e] = ss_hi[e] = 0.0f;
  };

  // The warps' partial sums meet in shared memory; the block writes the tile's outputs.
  auto epilogue = [&](int tile) {
  // C fragment: (row qr, cols 2qc, 2qc+1) and (row qr + 8, same cols) of each n8 tile.
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        red[warp][qr + (e >> 1) * 8][t * 8 + 2 * qc + (e & 1)] = acc[t][e];
#if PGK_PRO == 1
    // Row i's sum of squares is element (i, i) of its x . x tile: lane (qr = i, qc = i / 2),
    // C fragment entry i % 2 (rows 8-15: entry 2 + i % 2 of ss_hi).
    if (qc == (qr >> 1)) {  // constant indices: a dynamic one would put ss in local memory
      sumsq[warp][qr] = (qr & 1) ? ss[1] : ss[0];
      sumsq[warp][qr + 8] = upper ? ((qr & 1) ? ss_hi[3] : ss_hi[2]) : 0.0f;
    }
#endif
    __syncthreads();
    constexpr int OUT = PGK_GLU ? 4 * NT : 8 * NT;  // output columns per tile
    for (int i = threadIdx.x; i < 16 * OUT; i += PGK_GW * 32) {
      const int r = i / OUT, cn = i % OUT;
      const int row = pgk_grow(n, cn, tile);  // W's row; with GLU the gate's (up: cn + OUT)
      if (m0 + r >= m || row < 0) continue;
      float scale = 1.0f;
#if PGK_PRO == 1
      float q = 0.0f;
#pragma unroll
      for (int g = 0; g < PGK_GW; ++g) q += sumsq[g][r];
      scale = rsqrtf(q / (float)k + eps);
#endif
      float s = 0.0f;
#pragma unroll
      for (int g = 0; g < PGK_GW; ++g) s += red[g][r][cn];
      s *= scale;
      if (bias) s += pgk_to_float(bias[row]);
#if PGK_GLU == 1
      float up = 0.0f;
#pragma unroll
      for (int g = 0; g < PGK_GW; ++g) up += red[g][r][cn + OUT];
      up *= scale;
      if (bias) up += pgk_to_float(bias[n / 2 + row]);
      s = s / (1.0f + __expf(-s)) * up;  // silu(gate) * up
#else
      s = pgk_epilogue_act(s);
#endif
      if (res) s += pgk_to_float(res[(long long)(m0 + r) * res_stride + row]);
      y[(long long)(m0 + r) * y_stride + row] = pgk_from_float<pgk_t>(s);
    }
    __syncthreads();  // red is rewritten by the next tile
  };

  uint4 xa[U], xb[U];

#if PGK_GSTAGES > 0
  // W through shared memory in stages: cp.async moves each row's 32 * U columns as whole
  // 512-byte runs, and every load of a slab is issued at one point (x loaded straight into
  // fragments next to the MMAs was sunk by ptxas to its use, one L2 round trip per 32
  // columns: 2-3 TB/s). PGK_GSTAGES stages per warp keep the next slabs in flight while
  // the current one is multiplied; the stage sequence runs on across the block's tiles.
  // The warp's whole range of x (x_rows rows, rows past m zero-filled) and of the
  // prologue's gain is loaded once: staged beside W they cost a row each per stage, and
  // the gain row alone took the 2048 -> 11264 projection from 3 blocks per SM to 2.
  //
  // Launched as a programmatic dependent (decode chains of GEMVs), the kernel must wait
  // for the kernel before it before touching x, the residual or y. W is read before the
  // wait only when the launcher vouches that nothing before this kernel can still be
  // writing it (w_early: read-only weights in a captured graph): the first stages then
  // load while the predecessor runs. Otherwise the wait comes first and W only gets L2
  // prefetch hints (right whatever earlier work wrote).
  static_assert(U >= 2, "a staged slab row spans whole 128-byte lines");
  constexpr int NS = PGK_GSTAGES, SLD = 32 * U, SROWS = 8 * NT;
  constexpr int CPR = 4 * U;  // 16-byte pieces per row of a slab
  extern __shared__ __align__(16) unsigned char pgk_gsm[];
  pgk_t* wsm = reinterpret_cast<pgk_t*>(pgk_gsm) + warp * (NS * SROWS * SLD);
  const int xld = nch * 32 + 32;  // x and gain rows: all of K, padded
  pgk_t* xsm = reinterpret_cast<pgk_t*>(pgk_gsm) + PGK_GW * NS * SROWS * SLD;
  const pgk_t* gsm = xsm + x_rows * xld;       // the gain row (RMSNorm prologue)
  const int n_st = (c_hi - c_lo + U - 1) / U;  // slabs per tile
  const int total = my_tiles * n_st;
  // Piece i (0 .. NT * U - 1) of this lane in stage s of this warp (slab s % n_st of its
  // tile s / n_st): its place in shared memory, its source, whether it is inside W.
  auto piece = [&](int s, int i, pgk_t*& dst, const pgk_t*& src, int& pc) -> bool {
    const int tile = (int)blockIdx.x + (s / n_st) * (int)gridDim.x;
    const int c0 = c_lo + (s % n_st) * U;
    const int p = i * 32 + lane;
    const int r = p / CPR;
    pc = p % CPR;
    const int row = pgk_grow(n, r, tile), col = c0 * 32 + pc * 8;
    const bool in = row >= 0 && col < k && c0 + pc / 4 < c_hi;
    dst = wsm + (s % NS) * (SROWS * SLD) + r * SLD + pgk_gswz(r, pc) * 8;
    src = in ? w + (long long)row * w_stride + col : w;
    return in;
  };
  auto issue = [&](int s) {
#pragma unroll
    for (int i = 0; i < NT * U; ++i) {
      pgk_t* dst;
      const pgk_t* src;
      int pc;
      const bool in = piece(s, i, dst, src, pc);
      pgk_cp_async16(dst, src, in);
    }
  };
  auto hint = [&](int s) {  // one L2 prefetch per 128-byte line
#pragma unroll
    for (int i = 0; i < NT * U; ++i) {
      pgk_t* dst;
      const pgk_t* src;
      int pc;
      if (piece(s, i, dst, src, pc) && pc % 8 == 0) pgk_prefetch_l2(src);
    }
  };
  const int pre = NS - 1 < total ? NS - 1 : total;  // stages issued before the loop
  auto first_stages = [&]() {
    for (int s = 0; s < NS - 1; ++s) {
      if (s < pre) issue(s);
      pgk_cp_async_commit();
    }
  };
  if (w_early) {
    first_stages();
    for (int s = pre; s < pre + PGK_PF && s < total; ++s) hint(s);
  } else {
    for (int s = 0; s < PGK_PF && s < total; ++s) hint(s);
  }
  pgk_pdl_wait();
  pgk_pdl_trigger();
  {  // this warp's columns of x and the gain, as one group
    const int pieces = (c_hi - c_lo) * 4, rows = x_rows + (PGK_PRO == 1 ? 1 : 0);
    for (int p = lane; p < rows * pieces; p += 32) {
      const int r = p / pieces, col = c_lo * 32 + (p % pieces) * 8;
      const bool is_x = r < x_rows;
      const bool in = col < k && (!is_x || m0 + r < m);
      const pgk_t* src = is_x ? x + (long long)(m0 + r) * x_stride + col : pro + col;
      pgk_cp_async16(xsm + r * xld + col, in ? src : w, in);
    }
    pgk_cp_async_commit();
  }
  if (!w_early) first_stages();
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const bool r0 = qr < x_rows;  // the staged path takes up to 8 rows: the upper half is 0
  int s = 0;
  for (int ti = 0; ti < my_tiles; ++ti) {
    zero_acc();
    for (int j = 0; j < n_st; ++j, ++s) {
      if (s + NS - 1 < total) issue(s + NS - 1);
      pgk_cp_async_commit();
      // Groups: x and stages 0 .. NS-2 (x last with w_early, else first), then one stage
      // per step: stage s has at most NS - 1 groups after it; with w_early the first step
      // also needs x, which has one.
      if (w_early && s == 0) {
        pgk_cp_async_wait<1>();
      } else {
        pgk_cp_async_wait<NS - 1>();
      }
      __syncwarp();
      const pgk_t* src = wsm + (s % NS) * (SROWS * SLD) + qr * SLD;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        // Past the warp's range the smem holds no data (W there is zero-filled, x is not).
        const int c = c_lo + j * U + u, col = c * 32 + qc * 8;
        const bool cin = c < c_hi;
        xa[u] = r0 && cin ? *reinterpret_cast<const uint4*>(xsm + qr * xld + col) : zero;
        xb[u] = zero;
        if (PGK_PRO == 1) {
          const uint4 gv = cin ? *reinterpret_cast<const uint4*>(gsm + col) : zero;
          pgk_gprologue(xa[u], xb[u], gv, false, ss, ss_hi);
        }
      }
      const int sw = (qr & 1) << 2;  // pgk_gswz for this lane's rows (t * 8 + qr)
      pgk_gmma_slab<U, NT>(acc, xa, xb, [&](int u, int t) {
        return *reinterpret_cast<const uint4*>(src + t * 8 * SLD + ((u * 4 + qc) ^ sw) * 8);
      });
      __syncwarp();  // this stage is refilled by a later step's issue
    }
    epilogue((int)blockIdx.x + ti * (int)gridDim.x);
  }
  pgk_cp_async_wait<0>();
#else
  // Fragments straight from global memory, x one chunk at a time next to its MMAs: the
  // path for many rows of x (a slab of 16 x rows per warp made the staged path 2x slower
  // at M = 16, the x traffic then exceeding W's). W gets L2 prefetch hints before the
  // wait (right whatever earlier work wrote it).
  (void)w_early;
  (void)x_rows;
  const pgk_t* x0 = x + (long long)(x0in ? m0 + qr : 0) * x_stride + qc * 8;
  const pgk_t* x1 = x + (long long)(x1in ? m0 + qr + 8 : 0) * x_stride + qc * 8;
  const pgk_t* gain = PGK_PRO ? pro + qc * 8 : x0;  // one gain row serves every x row
  // A slab row is 32 * U columns, U / 2 128-byte lines; a lane takes every 32nd line.
  constexpr int PF_LINES = (PGK_PF * U + 1) / 2;  // per row of W
  for (int i = lane; i < 8 * NT * PF_LINES; i += 32) {
    const int r = i / PF_LINES, cc = (i % PF_LINES) * 64;  // 64 two-byte elements a line
    const int row = pgk_grow(n, r, blockIdx.x), col = c_lo * 32 + cc;
    if (row >= 0 && col < k && c_lo + cc / 32 < c_hi) {
      pgk_prefetch_l2(w + (long long)row * w_stride + col);
    }
  }
  pgk_pdl_wait();
  pgk_pdl_trigger();
  for (int ti = 0; ti < my_tiles; ++ti) {
    const int tile = (int)blockIdx.x + ti * (int)gridDim.x;
    const pgk_t* wrow[NT];
    bool nin[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int row = pgk_grow(n, t * 8 + qr, tile);
      nin[t] = row >= 0;
      wrow[t] = w + (long long)(nin[t] ? row : 0) * w_stride + qc * 8;
    }
    zero_acc();
    for (int c = c_lo; c < c_hi; c += U) {
      uint4 wv[U][NT];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int col = (c + u) * 32 + qc * 8;
        const bool in = c + u < c_hi && col < k;
#pragma unroll
        for (int t = 0; t < NT; ++t) wv[u][t] = pgk_gload_w(wrow[t] + (c + u) * 32, in && nin[t]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int col = (c + u) * 32 + qc * 8;
        const bool in = c + u < c_hi && col < k;
        uint4 xa1[1] = {pgk_gload_x(x0 + (c + u) * 32, in && x0in)};
        uint4 xb1[1] = {pgk_gload_x(x1 + (c + u) * 32, in && x1in)};
        if (PGK_PRO == 1) {
          const uint4 gv = pgk_gload_x(gain + (c + u) * 32, in);
          pgk_gprologue(xa1[0], xb1[0], gv, upper, ss, ss_hi);
        }
        pgk_gmma_slab<1, NT>(acc, xa1, xb1, [&](int, int t) { return wv[u][t]; });
      }
    }
    epilogue(tile);
  }
  (void)xa;
  (void)xb;
#endif
}
#endif
