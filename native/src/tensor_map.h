// Tensor maps for the bulk tensor copy engine (cuTensorMapEncodeTiled), made where the device
// pointers are known and handed to kernels by value (launch format 'T').
#pragma once

#include <pybind11/pybind11.h>

namespace pgk {

void register_tensor_maps(pybind11::module_& m);

}  // namespace pgk
