// Hopper (SM 9.0a) helpers shared by the wgmma families (attention_flash_sm90.cuh,
// skinny_sm90.cuh): tensor maps and the bulk tensor copy engine, mbarriers, wgmma shared-
// memory descriptors (128-byte swizzle) and the m64nNk16 wgmma with both operands in shared
// memory, K-major. PGK_HAB names the operand type (bf16 / f16), matching PGK_T.
#include "common.cuh"

#ifndef PGK_HAB
#define PGK_HAB bf16  // the wgmma operand type (bf16 / f16), matching PGK_T
#endif
#define PGK_HSTR2(x) #x
#define PGK_HSTR(x) PGK_HSTR2(x)
#define PGK_HABS PGK_HSTR(PGK_HAB)

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

// D (64 x 32, fp32) (+)= A (64 x 16, shared memory) B (32 x 16 K-major, shared
// memory); acc 0: D = A B.
PGK_DEVICE void pgk_wgmma_ss32(float* d, unsigned long long da, unsigned long long db,
                                 int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." PGK_HABS "." PGK_HABS " {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}
// Waits until at most one committed wgmma group is still running.
PGK_DEVICE void pgk_wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
// One box of a 2-d tensor map (coordinates innermost first) into shared memory,
// completing on `bar`.
PGK_DEVICE void pgk_htma2(void* dst, const pgk_tmap* map, int c0, int c1,
                          unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(pgk_hsmem(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(pgk_hsmem(bar))
      : "memory");
}
