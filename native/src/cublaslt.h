// cuBLASLt loaded at run time (no cublasLt.h at build time: the few types and entry points
// used are declared in cublaslt.cpp). Row-major GEMMs D = epilogue(op(A) @ op(B) + bias) (+ C)
// for f32, tf32, f16 and bf16 with fp32 accumulation, batched with strides, and FP8 (e4m3)
// A and B with fp32 scales (per tensor, per row or column, per 128 elements of a row or per
// 128 x 128 block: cuBLASLt 12.9+ on SM 9.0) into an f16/bf16/f32 D. Matmul descriptors,
// layouts and the chosen algorithm are cached per problem (LtPlanKey).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pgk {

// One GEMM problem in row-major terms: A is [M, K] (stored as [K, M] when trans_a), B is
// [K, N] (stored as [N, K] when trans_b), D is [M, N] with row stride ldd. Strides and
// leading dimensions are in elements; a batch stride of 0 broadcasts that operand. ldc > 0
// adds C [M, N] (row stride ldc, D's dtype; a linear's residual) with beta = 1: cuBLASLt
// adds it before the epilogue's activation, so only the none and bias epilogues take one
// (single matrices only).
struct LtPlanKey {
  int device = 0;
  int dtype = 0;      // cudaDataType of D (and bias, C), and of A and B unless in_dtype is set
  int in_dtype = -1;  // cudaDataType of A and B where it differs from D's (FP8 e4m3)
  // FP8 scales (cublasLtMatmulMatrixScale_t; -1 without): A's per tensor, per row or per
  // 128 columns of a row; B's per tensor, per row of the stored [N, K], per 128 columns of
  // such a row or per 128 x 128 block.
  int scale_a = -1, scale_b = -1;
  bool tf32 = false;
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int64_t ldc = 0;  // 0: no C (beta = 0)
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
  int epilogue = 0;    // index into kEpilogueNames
  int64_t align = 16;  // minimum byte alignment of every pointer the plan is run with
  int64_t workspace_bytes = 0;

  std::string str() const;
  bool operator<(const LtPlanKey& o) const;
};

// Validates the arguments (ValueError) and builds the key; needs no library or device.
LtPlanKey make_lt_key(int64_t m, int64_t n, int64_t k, const std::string& dtype, int64_t lda,
                      int64_t ldb, int64_t ldd, bool trans_a, bool trans_b, int64_t batch,
                      int64_t stride_a, int64_t stride_b, int64_t stride_d,
                      const std::string& epilogue, bool tf32, int64_t align,
                      int64_t workspace_bytes, int device, int64_t ldc = 0,
                      const std::string& in_dtype = "", const std::string& scale_a = "",
                      const std::string& scale_b = "");

std::string cublaslt_load(const std::vector<std::string>& candidates);
bool cublaslt_loaded();

void register_cublaslt(pybind11::module_& m);

}  // namespace pgk
