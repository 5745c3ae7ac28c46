// Python bindings of the driver: availability, versions, devices.
#pragma once

#include <pybind11/pybind11.h>

namespace pgk {

void register_driver(pybind11::module_& m);

}  // namespace pgk
