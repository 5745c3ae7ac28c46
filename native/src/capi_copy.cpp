#include "capi_copy.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "context.h"
#include "driver.h"
#include "errors.h"

namespace py = pybind11;

namespace pgk {
namespace {

// Per thread, as errno: two threads copying at once each read their own failure.
thread_local int t_code = 0;
thread_local std::string t_message;

int fail(int code, std::string message) {
  t_code = code;
  t_message = std::move(message);
  return code;
}

// Runs `body` with the selected device's context current; C++ exceptions never cross the
// C ABI, they become a code and a message.
template <typename F>
int guarded(const char* call, F&& body) {
  try {
    current_context();
    CUresult r = body(driver());
    if (r == cu::kSuccess || r == cu::kErrorNotReady) return r;
    check(r, call);  // builds the driver's name and description of r, then throws
    return r;
  } catch (const CudaError& e) {
    return fail(e.code() == 0 ? -1 : e.code(), e.what());
  } catch (const std::exception& e) {
    return fail(-1, std::string(call) + ": " + e.what());
  }
}

CUstream as_stream(uint64_t s) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(s)); }
CUevent as_event(uint64_t e) { return reinterpret_cast<CUevent>(static_cast<uintptr_t>(e)); }

int stream_priority_range(int* least, int* greatest) {
  return guarded("cuCtxGetStreamPriorityRange", [&](const cu::DriverApi& api) {
    return api.cuCtxGetStreamPriorityRange(least, greatest);
  });
}

int stream_create(int priority, uint64_t* stream) {
  return guarded("cuStreamCreateWithPriority", [&](const cu::DriverApi& api) {
    CUstream s = nullptr;
    CUresult r = api.cuStreamCreateWithPriority(&s, cu::kStreamNonBlocking, priority);
    *stream = reinterpret_cast<uintptr_t>(s);
    return r;
  });
}

void stream_destroy(uint64_t stream) {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuStreamDestroy(as_stream(stream));
}

int event_create(int timing, uint64_t* event) {
  return guarded("cuEventCreate", [&](const cu::DriverApi& api) {
    CUevent e = nullptr;
    CUresult r = api.cuEventCreate(&e, timing ? cu::kEventDefault : cu::kEventDisableTiming);
    *event = reinterpret_cast<uintptr_t>(e);
    return r;
  });
}

void event_destroy(uint64_t event) {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuEventDestroy(as_event(event));
}

int event_record(uint64_t event, uint64_t stream) {
  return guarded("cuEventRecord", [&](const cu::DriverApi& api) {
    return api.cuEventRecord(as_event(event), as_stream(stream));
  });
}

int event_query(uint64_t event) {
  return guarded("cuEventQuery",
                 [&](const cu::DriverApi& api) { return api.cuEventQuery(as_event(event)); });
}

int event_synchronize(uint64_t event) {
  return guarded("cuEventSynchronize", [&](const cu::DriverApi& api) {
    return api.cuEventSynchronize(as_event(event));
  });
}

int stream_wait_event(uint64_t stream, uint64_t event) {
  return guarded("cuStreamWaitEvent", [&](const cu::DriverApi& api) {
    return api.cuStreamWaitEvent(as_stream(stream), as_event(event), 0);
  });
}

int host_alloc(size_t nbytes, void** ptr) {
  return guarded("cuMemHostAlloc", [&](const cu::DriverApi& api) {
    return api.cuMemHostAlloc(ptr, nbytes ? nbytes : 1, cu::kMemHostAllocPortable);
  });
}

void host_free(void* ptr) {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuMemFreeHost(ptr);
}

int host_is_pinned(const void* ptr) {
  const cu::DriverApi* api = driver_if_loaded();
  if (!api) return 0;
  unsigned type = 0;
  CUresult r = api->cuPointerGetAttribute(&type, cu::kPointerAttrMemoryType,
                                          reinterpret_cast<CUdeviceptr>(ptr));
  // Pageable memory is unknown to the driver and answers CUDA_ERROR_INVALID_VALUE.
  return r == cu::kSuccess && type == cu::kMemoryTypeHost ? 1 : 0;
}

int memcpy_htod_async(uint64_t dst, const void* src, size_t nbytes, uint64_t stream) {
  return guarded("cuMemcpyHtoDAsync", [&](const cu::DriverApi& api) {
    return api.cuMemcpyHtoDAsync(dst, src, nbytes, as_stream(stream));
  });
}

int memcpy_dtoh_async(void* dst, uint64_t src, size_t nbytes, uint64_t stream) {
  return guarded("cuMemcpyDtoHAsync", [&](const cu::DriverApi& api) {
    return api.cuMemcpyDtoHAsync(dst, src, nbytes, as_stream(stream));
  });
}

int last_error(char* buf, size_t cap) {
  if (buf && cap) {
    size_t n = std::min(cap - 1, t_message.size());
    std::memcpy(buf, t_message.data(), n);
    buf[n] = '\0';
  }
  return t_code;
}

}  // namespace

const PgkCopyApi& copy_api() {
  static const PgkCopyApi api = {
      PGK_COPY_CAPI_VERSION, sizeof(PgkCopyApi), stream_priority_range, stream_create,
      stream_destroy,        event_create,       event_destroy,         event_record,
      event_query,           event_synchronize,  stream_wait_event,     host_alloc,
      host_free,             host_is_pinned,     memcpy_htod_async,     memcpy_dtoh_async,
      last_error,
  };
  return api;
}

void register_copy_capi(py::module_& m) {
  m.def(
      "copy_capi",
      []() {
        // The table is static; the capsule only points at it, so it has no destructor.
        void* p = const_cast<PgkCopyApi*>(&copy_api());
        return py::capsule(p, PGK_COPY_CAPI_NAME);
      },
      "The copy primitives' C ABI (PgkCopyApi) as a PyCapsule, for the Rust transfer "
      "engine (_rust.register_copy_capi).");
}

}  // namespace pgk
