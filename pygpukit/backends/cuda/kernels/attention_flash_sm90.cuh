// Tensor-core flash attention for prefill on Hopper (SM 9.0a: wgmma, the bulk tensor copy
// engine, setmaxnreg), bf16 / fp16: O = softmax(scale Q K^T + masks) V with the operands,
// masks and results of attention_flash.cuh (its header states them; pgk_attn_rows in
// common.cuh), online softmax in fp32, scores never in global memory.
//
// Q, K and V arrive through tensor maps (CUtensorMap, built by the launcher with the
// driver's cuTensorMapEncodeTiled over [batch, heads, seq, D] and passed by value as
// __grid_constant__ parameters): each 64-column panel of a tile (128 bytes a row) lands in
// shared memory in the 128-byte swizzle that wgmma's descriptors read; rows past the end
// of a tensor are zero-filled by the copy engine. O is stored from registers.
//
// Block: three warpgroups. Warpgroup 0 is the producer (one thread issues the copies, the
// registers go to the others by setmaxnreg): Q once, then K and V tiles of PGK_HN keys
// through PGK_HSTAGES stages, each with a full barrier for K and one for V (complete_tx)
// and an empty barrier the consumers arrive on once done with the stage. Warpgroups 1 and
// 2 each own 64 query rows: S = Q K^T by wgmma m64nNk16 (both operands in shared memory,
// K-major), the online softmax on the accumulator fragments (two rows a thread, a row's
// scores in one quad, as mma.sync's m16n8 layout), then O += P V by wgmma with P from
// registers and V N-major (transposed) from shared memory.
//
// Masks: a tile every row of a warpgroup sees whole takes no mask; others compute each
// row's bounds. The copy engine loads keys a mask hides (outside [kv_start, kv_len), the
// causal diagonal's far side, past the window) as they are, so a masked tile whose V
// holds a NaN or inf takes a scalar P V that selects the visible keys, reading V from
// global memory (as attention_flash.cuh does): a hidden value never reaches the result.
#include "common.cuh"

#ifndef PGK_D
#define PGK_D 128
#endif
#ifndef PGK_HN
#define PGK_HN 128  // keys per tile
#endif
#ifndef PGK_HSTAGES
#define PGK_HSTAGES 2  // K / V stages
#endif
#ifndef PGK_HAB
#define PGK_HAB bf16  // the wgmma operand type (bf16 / f16), matching PGK_T
#endif
#ifndef PGK_ERR_INDEX
#define PGK_ERR_INDEX 1
#endif
#define PGK_HSTR2(x) #x
#define PGK_HSTR(x) PGK_HSTR2(x)
#define PGK_HABS PGK_HSTR(PGK_HAB)
#define PGK_HWG 2                        // consumer warpgroups
#define PGK_HM (64 * PGK_HWG)            // query rows a block
#define PGK_HT (128 * (PGK_HWG + 1))     // threads a block
#define PGK_HP (PGK_D / 64)              // 64-column panels a row
#define PGK_HQB (64 * PGK_D * 2)         // bytes of one warpgroup's Q rows
#define PGK_HKP (PGK_HN * 128)           // bytes of one panel of a K / V tile
#define PGK_HKB (PGK_HKP * PGK_HP)       // bytes of a K (or V) tile
#define PGK_HSTAGE (2 * PGK_HKB)         // one stage: the K tile, then the V tile
#define PGK_HKV0 (PGK_HWG * PGK_HQB)     // the stages' offset (after Q)
#define PGK_HDN (PGK_D / 8)              // 8-column groups of O
#define PGK_HSN (PGK_HN / 8)             // 8-key groups of S

static_assert(sizeof(pgk_t) == 2, "attention_flash_sm90 takes bf16 or f16");
static_assert(PGK_D == 64 || PGK_D == 128, "head_dim 64 or 128");
static_assert(PGK_HN == 64 || PGK_HN == 128, "64 or 128 keys a tile");
static_assert(PGK_HSTAGES >= 2, "at least two stages");

// A CUtensorMap: 128 opaque bytes, 64-byte aligned (the driver writes it, the copy engine
// reads it from the kernel's parameters).
struct __align__(64) pgk_tmap {
  unsigned long long w[16];
};

PGK_DEVICE unsigned pgk_hsmem(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
PGK_DEVICE void pgk_hbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(pgk_hsmem(bar)), "r"(count)
               : "memory");
}
// Arrive once and expect `bytes` more from the copy engine before the phase completes.
PGK_DEVICE void pgk_hbar_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(pgk_hsmem(bar)),
               "r"(bytes)
               : "memory");
}
PGK_DEVICE void pgk_hbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(pgk_hsmem(bar)) : "memory");
}
// Wait until the phase of parity `parity` has completed.
PGK_DEVICE void pgk_hbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(pgk_hsmem(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// One box of a 4-d tensor map (coordinates innermost first) into shared memory,
// completing on `bar`.
PGK_DEVICE void pgk_htma(void* dst, const pgk_tmap* map, int c0, int c1, int c2, int c3,
                         unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(pgk_hsmem(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(pgk_hsmem(bar))
      : "memory");
}
// A wgmma shared-memory descriptor: 128-byte swizzle, leading and stride byte offsets.
PGK_DEVICE unsigned long long pgk_hdesc(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) |
         ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32) |
         (1ull << 62);
}
PGK_DEVICE void pgk_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
PGK_DEVICE void pgk_wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
PGK_DEVICE void pgk_wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Ties n accumulator registers to this point: reads after a wgmma wait stay after it.
template <int N> PGK_DEVICE void pgk_wg_hold(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Whether any thread of this warpgroup (named barrier id, 128 threads) has p set.
PGK_DEVICE bool pgk_hbar_or(int id, bool p) {
  unsigned r;
  asm volatile(
      "{\n.reg .pred a, b;\nsetp.ne.u32 a, %1, 0;\nbar.red.or.pred b, %2, 128, a;\n"
      "selp.u32 %0, 1, 0, b;\n}\n"
      : "=r"(r)
      : "r"((unsigned)p), "r"(id)
      : "memory");
  return r != 0;
}
// Two fp32 values as one register of two pgk_t (lo in the low half).
PGK_DEVICE unsigned pgk_hpack(float lo, float hi) {
  pgk_t h[2];
  pgk_from_acc2(lo, hi, h);
  return *reinterpret_cast<unsigned*>(h);
}
PGK_DEVICE float pgk_hexp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Whether either 16-bit element of w is NaN or inf (exponent bits all set).
PGK_DEVICE bool pgk_hnonfinite2(unsigned w) {
  constexpr unsigned e = sizeof(PGK_HABS) == 5 ? 0x7F80u : 0x7C00u;  // "bf16" : "f16"
  return (w & e) == e || ((w >> 16) & e) == e;
}

// D (64 x 64, fp32) (+)= A (64 x 16, shared memory) B (64 x 16 K-major, shared
// memory); acc 0: D = A B.
PGK_DEVICE void pgk_wgmma_ss64(float* d, unsigned long long da, unsigned long long db,
                                 int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." PGK_HABS "." PGK_HABS " {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
// D (64 x 64, fp32) += A (64 x 16, registers: the accumulator fragment layout as
// pairs) B (16 x 64 N-major, shared memory).
PGK_DEVICE void pgk_wgmma_rs64(float* d, const unsigned* a, unsigned long long db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." PGK_HABS "." PGK_HABS " {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// D (64 x 128, fp32) (+)= A (64 x 16, shared memory) B (128 x 16 K-major, shared
// memory); acc 0: D = A B.
PGK_DEVICE void pgk_wgmma_ss128(float* d, unsigned long long da, unsigned long long db,
                                 int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." PGK_HABS "." PGK_HABS " {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
      "%60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}
// D (64 x 128, fp32) += A (64 x 16, registers: the accumulator fragment layout as
// pairs) B (16 x 128 N-major, shared memory).
PGK_DEVICE void pgk_wgmma_rs128(float* d, const unsigned* a, unsigned long long db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." PGK_HABS "." PGK_HABS " {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
      "%60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// The accumulator-shaped wgmma of N columns (S: PGK_HN keys, O: PGK_D columns).
template <int N> PGK_DEVICE void pgk_wgmma_ss(float* d, unsigned long long a,
                                               unsigned long long b, int acc) {
  if constexpr (N == 64)
    pgk_wgmma_ss64(d, a, b, acc);
  else
    pgk_wgmma_ss128(d, a, b, acc);
}
template <int N> PGK_DEVICE void pgk_wgmma_rs(float* d, const unsigned* a, unsigned long long b) {
  if constexpr (N == 64)
    pgk_wgmma_rs64(d, a, b);
  else
    pgk_wgmma_rs128(d, a, b);
}

extern "C" __global__ void __launch_bounds__(PGK_HT, 1)
    pgk_attention_flash_sm90(const __grid_constant__ pgk_tmap tm_q,
                             const __grid_constant__ pgk_tmap tm_k,
                             const __grid_constant__ pgk_tmap tm_v,
                             const pgk_t* __restrict__ v, long long v_sb, long long v_sh,
                             long long v_ss, pgk_t* __restrict__ o,
                             int n_heads, int n_kv_heads, int kv_batch, int seq_q, int seq_k,
                             float scale, int causal, int window, const int* __restrict__ kv_len,
                             const int* __restrict__ kv_start, long long kvs_stride,
                             int kv_wide, long long o_sb, long long o_sh, long long o_ss,
                             long long* __restrict__ err, long long tag) {
  pgk_pdl_wait();  // launched as a programmatic dependent: see common.cuh
  pgk_pdl_trigger();
  __shared__ __align__(8) unsigned long long bar_q, bar_k[PGK_HSTAGES], bar_v[PGK_HSTAGES],
      bar_e[PGK_HSTAGES];
  extern __shared__ __align__(16) unsigned char pgk_hsmem_raw[];
  // The swizzle is a function of the address: every tile starts 1024-byte aligned (the
  // launcher asks for 1 KB of slack).
  unsigned char* smem = pgk_hsmem_raw + ((1024 - (pgk_hsmem(pgk_hsmem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7;

  // Heads fastest, query blocks last-first (as attention_flash.cuh).
  const int n_q_blocks = (seq_q + PGK_HM - 1) / PGK_HM;
  const int bh_all = (int)(gridDim.x / n_q_blocks);  // batch * heads
  const int bh = (int)(blockIdx.x % bh_all);
  const int qblock = n_q_blocks - 1 - (int)(blockIdx.x / bh_all);
  const int b = bh / n_heads, h = bh % n_heads;
  const int kvh = h / (n_heads / n_kv_heads);
  const int q0 = qblock * PGK_HM;

  int len, start;
  pgk_attn_bounds(kv_len, kv_start, kvs_stride, kv_wide, b, seq_k,
                  tid == 128 && (int)blockIdx.x < bh_all && h == 0 ? err : nullptr, tag,
                  PGK_ERR_INDEX, len, start);  // one thread of a block a batch row reports
  const int last = min(q0 + PGK_HM, seq_q) - 1;
  int lo_first, hi_first, lo_last, hi_last;
  pgk_attn_rows(q0, seq_q, len, start, causal, window, lo_first, hi_first);
  pgk_attn_rows(last, seq_q, len, start, causal, window, lo_last, hi_last);
  const int t_begin = lo_first / PGK_HN;
  const int t_end = hi_last > lo_first ? (hi_last + PGK_HN - 1) / PGK_HN : t_begin;

  if (tid == 0) {
    pgk_hbar_init(&bar_q, 1);
    for (int s = 0; s < PGK_HSTAGES; ++s) {
      pgk_hbar_init(&bar_k[s], 1);
      pgk_hbar_init(&bar_v[s], 1);
      pgk_hbar_init(&bar_e[s], 128 * PGK_HWG);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // The producer: its registers go to the consumers.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid != 0 || t_begin >= t_end) return;
    const int kb = kv_batch > 1 ? b : 0;
    pgk_hbar_expect(&bar_q, PGK_HWG * PGK_HQB);
#pragma unroll
    for (int c = 0; c < PGK_HWG; ++c)
#pragma unroll
      for (int p = 0; p < PGK_HP; ++p)
        pgk_htma(smem + c * PGK_HQB + p * 8192, &tm_q, p * 64, q0 + 64 * c, h, b, &bar_q);
    for (int t = t_begin; t < t_end; ++t) {
      const int i = t - t_begin, s = i % PGK_HSTAGES;
      // The stage's previous tile is done with (a fresh barrier passes parity 1 at once).
      pgk_hbar_wait(&bar_e[s], ((i / PGK_HSTAGES) & 1) ^ 1);
      unsigned char* ks = smem + PGK_HKV0 + s * PGK_HSTAGE;
      pgk_hbar_expect(&bar_k[s], PGK_HKB);
#pragma unroll
      for (int p = 0; p < PGK_HP; ++p)
        pgk_htma(ks + p * PGK_HKP, &tm_k, p * 64, t * PGK_HN, kvh, kb, &bar_k[s]);
      pgk_hbar_expect(&bar_v[s], PGK_HKB);
#pragma unroll
      for (int p = 0; p < PGK_HP; ++p)
        pgk_htma(ks + PGK_HKB + p * PGK_HKP, &tm_v, p * 64, t * PGK_HN, kvh, kb, &bar_v[s]);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int c = wg - 1, wtid = tid & 127, warp = wtid >> 5;
  // This warpgroup's rows, and this thread's two (fragment rows lane / 4 and + 8).
  const int r0 = q0 + 64 * c;
  const int row_a = r0 + warp * 16 + (lane >> 2);
  int wlo_first, whi_first, wlo_last, whi_last;
  pgk_attn_rows(min(r0, seq_q - 1), seq_q, len, start, causal, window, wlo_first, whi_first);
  pgk_attn_rows(min(r0 + 63, seq_q - 1), seq_q, len, start, causal, window, wlo_last,
                whi_last);
  const unsigned q_addr = pgk_hsmem(smem + c * PGK_HQB);
  const unsigned kv_addr = pgk_hsmem(smem + PGK_HKV0);

  float acc[PGK_HDN * 4];
#pragma unroll
  for (int i = 0; i < PGK_HDN * 4; ++i) acc[i] = 0.0f;
  float m[2] = {-PGK_INF, -PGK_INF}, l[2] = {0.0f, 0.0f};
  const float qscale = scale * 1.4426950408889634f;  // scores go through exp2

  if (t_begin < t_end) pgk_hbar_wait(&bar_q, 0);
  for (int t = t_begin; t < t_end; ++t) {
    const int i = t - t_begin, st = i % PGK_HSTAGES;
    const unsigned par = (i / PGK_HSTAGES) & 1;
    const unsigned k_addr = kv_addr + st * PGK_HSTAGE, v_addr = k_addr + PGK_HKB;
    const int j0 = t * PGK_HN;
    const bool masked = !(j0 >= wlo_last && j0 + PGK_HN <= whi_first);

    // S = Q K^T over D / 16 k steps; a step is 32 bytes into a 128-byte swizzled row.
    float s[PGK_HSN * 4];
    pgk_hbar_wait(&bar_k[st], par);
    pgk_wg_fence();
#pragma unroll
    for (int kk = 0; kk < PGK_D / 16; ++kk) {
      const unsigned off = (kk & 3) * 32;
      const unsigned long long da = pgk_hdesc(q_addr + (kk >> 2) * 8192 + off, 16, 1024);
      const unsigned long long db = pgk_hdesc(k_addr + (kk >> 2) * PGK_HKP + off, 16, 1024);
      pgk_wgmma_ss<PGK_HN>(s, da, db, kk);
    }
    pgk_wg_commit();
    pgk_wg_wait0();
    pgk_wg_hold<PGK_HSN * 4>(s);

    // Online softmax, two rows a thread (hr 0: row_a, 1: row_a + 8).
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      int lo = 0, hi = 0;
      if (masked) pgk_attn_rows(row_a + hr * 8, seq_q, len, start, causal, window, lo, hi);
#pragma unroll
      for (int n = 0; n < PGK_HSN; ++n)
#pragma unroll
        for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
          float x = s[n * 4 + e] * qscale;
          if (masked) {
            const int j = j0 + n * 8 + (lane & 3) * 2 + (e & 1);
            x = j >= lo && j < hi ? x : -PGK_INF;
          }
          s[n * 4 + e] = x;
          mx[hr] = fmaxf(mx[hr], x);  // skips NaN: a NaN score stays NaN as p
        }
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
      mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
      // A row that has seen no visible key keeps max -inf: subtract 0 instead.
      const float base = mx[hr] == -PGK_INF ? 0.0f : mx[hr];
      const float alpha = pgk_hexp2(m[hr] - base);
      m[hr] = mx[hr];
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < PGK_HSN; ++n)
#pragma unroll
        for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
          s[n * 4 + e] = pgk_hexp2(s[n * 4 + e] - base);
          sum += s[n * 4 + e];
        }
      l[hr] = l[hr] * alpha + sum;  // this thread's part; the quad sums at the end
#pragma unroll
      for (int n = 0; n < PGK_HDN; ++n) {
        acc[n * 4 + 2 * hr] *= alpha;
        acc[n * 4 + 2 * hr + 1] *= alpha;
      }
    }

    pgk_hbar_wait(&bar_v[st], par);
    const unsigned char* vs = smem + PGK_HKV0 + st * PGK_HSTAGE + PGK_HKB;
    // A masked tile with a NaN / inf in its V: the scalar P V below (the warpgroup agrees).
    bool scalar_pv = false;
    if (masked) {
      bool bad = false;
      const unsigned* vw = reinterpret_cast<const unsigned*>(vs);
      for (int e = wtid; e < PGK_HKB / 4; e += 128) bad |= pgk_hnonfinite2(vw[e]);
      scalar_pv = pgk_hbar_or(1 + c, bad);
    }
    if (!scalar_pv) {
      unsigned pa[PGK_HN / 16][4];
#pragma unroll
      for (int kk = 0; kk < PGK_HN / 16; ++kk) {
        pa[kk][0] = pgk_hpack(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
        pa[kk][1] = pgk_hpack(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
        pa[kk][2] = pgk_hpack(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
        pa[kk][3] = pgk_hpack(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
      }
      pgk_wg_fence();
#pragma unroll
      for (int kk = 0; kk < PGK_HN / 16; ++kk) {
        // 16 keys a step (2048 bytes); the next 64 columns one panel on (LBO).
        const unsigned long long db = pgk_hdesc(v_addr + kk * 2048, PGK_HKP, 1024);
        pgk_wgmma_rs<PGK_D>(acc, pa[kk], db);
      }
      pgk_wg_commit();
      pgk_wg_wait0();
      pgk_wg_hold<PGK_HDN * 4>(acc);
    } else {
      // Each key's probability comes from the quad lane that holds it; a hidden key is
      // skipped (selected out), never multiplied. V is read from global memory (a rare
      // path: a NaN / inf in a masked tile).
      const pgk_t* vg = v + (kv_batch > 1 ? b : 0) * v_sb + kvh * v_sh + (lane & 3) * 2;
      int lo[2], hi[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        pgk_attn_rows(row_a + hr * 8, seq_q, len, start, causal, window, lo[hr], hi[hr]);
#pragma unroll
      for (int n = 0; n < PGK_HSN; ++n)
#pragma unroll 1
        for (int cq = 0; cq < 4; ++cq)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = j0 + n * 8 + 2 * cq + e;
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              const float p = __shfl_sync(0xffffffffu, s[n * 4 + 2 * hr + e], (lane & ~3) | cq);
              if (j >= lo[hr] && j < hi[hr]) {
#pragma unroll
                for (int dn = 0; dn < PGK_HDN; ++dn) {
                  const pgk_t* vr = vg + j * v_ss + dn * 8;
                  acc[dn * 4 + 2 * hr] += p * pgk_to_float(vr[0]);
                  acc[dn * 4 + 2 * hr + 1] += p * pgk_to_float(vr[1]);
                }
              }
            }
          }
    }
    pgk_hbar_arrive(&bar_e[st]);  // the stage may be refilled
  }

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float sum = l[hr];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int i = row_a + hr * 8;
    if (i >= seq_q) continue;
    // No visible key: zeros. A NaN sum (NaN or inf in what the row sees) stays NaN, and
    // so does a zero sum over visible keys (every score -inf: exp(-inf - -inf) is NaN).
    int lo, hi;
    pgk_attn_rows(i, seq_q, len, start, causal, window, lo, hi);
    const float empty = lo < hi ? __int_as_float(0x7fc00000) : 0.0f;
    const float inv = 1.0f / sum;
    pgk_t* orow = o + b * o_sb + h * o_sh + i * o_ss + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < PGK_HDN; ++n) {
      const float a0 = sum == 0.0f ? empty : acc[n * 4 + 2 * hr] * inv;
      const float a1 = sum == 0.0f ? empty : acc[n * 4 + 2 * hr + 1] * inv;
      pgk_from_acc2(a0, a1, orow + n * 8);
    }
  }
}
