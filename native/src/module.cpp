#include <pybind11/pybind11.h>

#include "capi_launch.h"
#include "capi_copy.h"
#include "cublaslt.h"
#include "dlpack.h"
#include "driver_bindings.h"
#include "errors.h"
#include "graph.h"
#include "host_buffer.h"
#include "kernel.h"
#include "kernel_cache.h"
#include "memory.h"
#include "nvrtc.h"
#include "stream.h"
#include "tensor_map.h"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
  m.doc() = "PyGPUkit C++ layer: CUDA driver, NVRTC, launches, graphs, cuBLASLt";
  pgk::register_errors(m);
  pgk::register_driver(m);
  pgk::register_nvrtc(m);
  pgk::register_kernel_cache(m);
  pgk::register_memory(m);
  pgk::register_host_buffer(m);
  pgk::register_streams(m);
  pgk::register_graphs(m);
  pgk::register_kernels(m);
  pgk::register_launch_capi(m);
  pgk::register_cublaslt(m);
  pgk::register_dlpack(m);
  pgk::register_copy_capi(m);
  pgk::register_tensor_maps(m);
}
