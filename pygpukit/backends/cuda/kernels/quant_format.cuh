// The quantized weight layout's defines, shared by the families that read it (gemv_quant:
// the decode GEMV; dequant: the prefill's dequantization); ir/quant.py owns the layouts:
//   PGK_QFMT 0 int8 [N, K] (scale per row), 1 fp8 e4m3 [N, K] (scale per tensor, per row or
//   per 128 x 128 block), 2 int4 [N, K/2] (low nibble first; scale and, PGK_QZERO, uint8
//   zero point per group of PGK_QGROUP along K; symmetric: zero 8).
// A header, not a family: it declares no kernel.
#ifndef PGK_QFMT
#define PGK_QFMT 0
#endif
#ifndef PGK_QSK
#define PGK_QSK 0  // 1: the scale varies along K (fp8 blocks, int4 groups)
#endif
#ifndef PGK_QTENSOR
#define PGK_QTENSOR 0  // fp8 with one scale for the whole tensor
#endif
#ifndef PGK_QGROUP
#define PGK_QGROUP 128  // K elements per scale when PGK_QSK (fp8: the block size)
#endif
#ifndef PGK_QZERO
#define PGK_QZERO 0
#endif
