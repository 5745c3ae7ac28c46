// The destructor of the DLPack capsules pygpukit.interop exports, in C: a consumer may drop
// an unconsumed capsule while it is raising (NumPy rejecting a dtype it has no DLPack code
// for), and a Python destructor would run with that exception pending and lose it.
#pragma once

#include <pybind11/pybind11.h>

namespace pgk {

void register_dlpack(pybind11::module_& m);

}  // namespace pgk
