#include <pybind11/pybind11.h>

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
  m.doc() = "PyGPUkit C++ layer: CUDA driver, NVRTC, launches, graphs";
}
