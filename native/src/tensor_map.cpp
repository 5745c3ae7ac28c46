#include "tensor_map.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "driver.h"
#include "errors.h"

namespace py = pybind11;

namespace pgk {
namespace {

// CUtensorMapDataType values the kernels use (ABI-stable, as cuda.h numbers them).
constexpr int kTensorMapFloat16 = 6;
constexpr int kTensorMapBFloat16 = 9;
constexpr int kMaxRank = 5;

int data_type(const std::string& dtype) {
  if (dtype == "float16") return kTensorMapFloat16;
  if (dtype == "bfloat16") return kTensorMapBFloat16;
  throw py::value_error("tensor_map_tiled: dtype must be float16 or bfloat16, got " + dtype);
}

// A tiled tensor map over `dims` (innermost first) at `address`, with byte strides of the
// outer dims, boxes of `box` elements, the given swizzle (0 none, 1 32B, 2 64B, 3 128B) and
// L2 promotion (0 none to 3 256B); out-of-bounds elements read as zeros. Returns the 128
// bytes a kernel takes as a __grid_constant__ parameter.
py::bytes tensor_map_tiled(const std::string& dtype, uint64_t address,
                           const std::vector<cuuint64_t>& dims,
                           const std::vector<cuuint64_t>& strides, const std::vector<unsigned>& box,
                           int swizzle, int l2_promotion) {
  const size_t rank = dims.size();
  if (rank < 1 || rank > kMaxRank || strides.size() + 1 != rank || box.size() != rank) {
    throw py::value_error("tensor_map_tiled: need 1 to 5 dims, one stride fewer, a box per dim");
  }
  if (swizzle < 0 || swizzle > 3 || l2_promotion < 0 || l2_promotion > 3) {
    throw py::value_error("tensor_map_tiled: swizzle and l2_promotion must be in [0, 3]");
  }
  const int type = data_type(dtype);
  std::vector<unsigned> element_strides(rank, 1);
  cu::TensorMap map{};
  const CUresult r = driver().cuTensorMapEncodeTiled(
      &map, type, static_cast<unsigned>(rank), reinterpret_cast<void*>(address), dims.data(),
      strides.data(), box.data(), element_strides.data(), /*interleave=*/0, swizzle, l2_promotion,
      /*oob_fill=*/0);
  check_cu(r, "cuTensorMapEncodeTiled");
  return py::bytes(reinterpret_cast<const char*>(map.bytes), sizeof(map.bytes));
}

}  // namespace

void register_tensor_maps(py::module_& m) {
  m.def("tensor_map_tiled", &tensor_map_tiled, py::arg("dtype"), py::arg("address"),
        py::arg("dims"), py::arg("strides"), py::arg("box"), py::arg("swizzle") = 3,
        py::arg("l2_promotion") = 2,
        "A CUtensorMap (128 bytes, cuTensorMapEncodeTiled) over a float16 / bfloat16 tensor: "
        "dims innermost first, byte strides of the outer dims, box sizes, swizzle 0-3 (none, "
        "32B, 64B, 128B), l2_promotion 0-3; out-of-bounds elements read as zeros. Launch "
        "format 'T' passes it to a kernel's __grid_constant__ parameter.");
}

}  // namespace pgk
