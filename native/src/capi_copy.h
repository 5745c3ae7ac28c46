// The CUDA copy primitives as a C ABI: a table of plain function pointers that the Rust
// transfer engine (rust/pygpukit-core/src/transfer) calls, so Rust needs no CUDA headers
// and no second copy of the driver loader. Exported to Python as a PyCapsule
// (_native.copy_capi()) that the CUDA backend hands to _rust.register_copy_capi at import.
//
// Every function returns a CUresult (0 on success; -1 when the failure was not a driver
// error, e.g. no driver). After a failure, last_error gives the code and the message of
// this thread's last failure. Streams and events travel as 64-bit handles; 0 is the legacy
// default stream. Each call makes the selected device's context current first.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define PGK_COPY_CAPI_NAME "pygpukit._native.copy_capi"
// Raise when a field is added or a signature changes; the Rust side refuses other versions.
#define PGK_COPY_CAPI_VERSION 1

extern "C" {

typedef struct PgkCopyApi {
  uint32_t version;  // first, so any reader can check it before trusting the layout
  uint32_t size;     // sizeof(PgkCopyApi)
  // (least, greatest) stream priority; greatest is numerically smallest.
  int (*stream_priority_range)(int* least, int* greatest);
  // A non-blocking stream (no implicit ordering with the legacy default stream).
  int (*stream_create)(int priority, uint64_t* stream);
  void (*stream_destroy)(uint64_t stream);
  int (*event_create)(int timing, uint64_t* event);
  void (*event_destroy)(uint64_t event);
  int (*event_record)(uint64_t event, uint64_t stream);
  // 0 when the recorded work has finished, 600 (not ready) while it runs, else an error.
  int (*event_query)(uint64_t event);
  int (*event_synchronize)(uint64_t event);
  // Later work on `stream` waits for the work recorded by `event` at the time of the call.
  int (*stream_wait_event)(uint64_t stream, uint64_t event);
  // Page-locked, portable host memory.
  int (*host_alloc)(size_t nbytes, void** ptr);
  void (*host_free)(void* ptr);
  // 1 when ptr lies in page-locked memory known to the driver, else 0.
  int (*host_is_pinned)(const void* ptr);
  int (*memcpy_htod_async)(uint64_t dst, const void* src, size_t nbytes, uint64_t stream);
  int (*memcpy_dtoh_async)(void* dst, uint64_t src, size_t nbytes, uint64_t stream);
  // The code of this thread's last failure (0 if none); its message, NUL-terminated and
  // truncated to cap bytes, goes to buf when buf is not null.
  int (*last_error)(char* buf, size_t cap);
} PgkCopyApi;

}  // extern "C"

#include <pybind11/pybind11.h>

namespace pgk {

const PgkCopyApi& copy_api();

void register_copy_capi(pybind11::module_& m);

}  // namespace pgk
