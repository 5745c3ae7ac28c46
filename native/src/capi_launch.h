// The launch C ABI: a table of plain C functions over the CUDA driver that the Rust dispatch
// controller calls without going through Python. `_native.launch_capi()` hands it out as a
// PyCapsule; `_rust.register_launch_capi(capsule)` takes it at CUDA-backend init. The table
// is static: it lives as long as the process.
#pragma once

#include <cstdint>

#include <pybind11/pybind11.h>

extern "C" {

#define PGK_LAUNCH_CAPI_VERSION 1u
#define PGK_LAUNCH_CAPI_NAME "pygpukit._native.launch_capi"

// Every entry returns 0 or the driver's CUresult (event_query: 0 done, 600 not ready).
struct PgkLaunchCapi {
  uint32_t version;  // PGK_LAUNCH_CAPI_VERSION
  uint32_t size;     // sizeof(PgkLaunchCapi): later versions only append entries
  // func: a CUfunction of context ctx (made current first); params[i] points at the bytes of
  // kernel parameter i, as cuLaunchKernel's kernelParams. pdl: programmatic stream
  // serialization (SM 9.0+).
  int (*launch)(uint64_t ctx, uint64_t func, const uint32_t* grid3, const uint32_t* block3,
                uint32_t shared_mem, uint64_t stream, int pdl, void** params);
  int (*event_create)(uint64_t ctx, uint64_t* event);  // a timing-disabled event
  int (*event_record)(uint64_t event, uint64_t stream);
  int (*event_query)(uint64_t event);
  int (*event_synchronize)(uint64_t event);
  int (*event_destroy)(uint64_t event);
  // The driver's name and description of a CUresult (static strings).
  const char* (*error_string)(int code);
  // cuGraphLaunch of an instantiated graph (GraphExec.handle) into stream, with whatever
  // context is current (as GraphExec.launch): a compiled call's quick hit (rust/ quick.rs).
  int (*graph_launch)(uint64_t exec, uint64_t stream);
};
}

namespace pgk {

// Binds launch_capi() and the launch recorder (set_launch_recorder) into the module.
void register_launch_capi(pybind11::module_& m);

// The recorder set by set_launch_recorder, or null: Function.launch calls it after each launch.
PyObject* launch_recorder();

}  // namespace pgk
