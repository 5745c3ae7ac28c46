// Device allocations, memset and copies (host copies go through the context's staging pool
// unless the host memory is already page-locked), plus page-locked host buffers.
#pragma once

#include <pybind11/pybind11.h>

namespace pgk {

void register_memory(pybind11::module_& m);

}  // namespace pgk
