// Device allocations, memset and raw copies (pageable host memory left to the driver; the
// product's host copies go through the Rust transfer engine), plus page-locked host buffers.
#pragma once

#include <pybind11/pybind11.h>

namespace pgk {

void register_memory(pybind11::module_& m);

}  // namespace pgk
