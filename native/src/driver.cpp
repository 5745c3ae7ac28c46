#include "driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "errors.h"

namespace pgk {
namespace {

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t, int*);
using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

struct LoadState {
  std::mutex mu;
  bool attempted = false;
  cu::DriverApi api;
  std::string error;  // empty when loaded
  CUresult init_result = cu::kSuccess;
};

// Leaked on purpose: the library stays loaded for the whole process, because handles
// destroyed during interpreter shutdown still call into it.
LoadState& state() {
  static LoadState* s = new LoadState();
  return *s;
}

std::atomic<const cu::DriverApi*> g_loaded{nullptr};

std::string load_into(cu::DriverApi& api) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    std::string reason = why ? why : "dlopen failed";
    lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return "cannot load libcuda.so.1 (no NVIDIA driver?): " + reason;
  }
  // The v2 signature (CUDA 12+) reports whether a symbol exists at the requested version.
  auto v2 = reinterpret_cast<GetProcV2>(dlsym(lib, "cuGetProcAddress_v2"));
  auto v1 = reinterpret_cast<GetProcV1>(dlsym(lib, "cuGetProcAddress"));
  if (!v2 && !v1) return "libcuda.so.1 has no cuGetProcAddress (driver older than CUDA 11.3)";
  auto resolve = [&](const char* name, void** slot, int version = cu::kApiVersion) -> std::string {
    CUresult r;
    if (v2) {
      int status = 0;
      r = v2(name, slot, version, 0, &status);
      if (r == cu::kSuccess && status != 0) r = cu::kErrorInvalidValue;
    } else {
      r = v1(name, slot, version, 0);
    }
    if (r != cu::kSuccess || *slot == nullptr) {
      *slot = nullptr;
      return std::string("driver entry point ") + name + " not found (driver too old?)";
    }
    return "";
  };
#define PGK_RESOLVE(name, sig)                                                           \
  if (std::string e = resolve(#name, reinterpret_cast<void**>(&api.name)); !e.empty()) { \
    return e;                                                                            \
  }
  PGK_DRIVER_ENTRY_POINTS(PGK_RESOLVE)
#undef PGK_RESOLVE
#define PGK_RESOLVE_OPTIONAL(name, sig) \
  resolve(#name, reinterpret_cast<void**>(&api.name), cu::kApiVersion12030);
  PGK_DRIVER_ENTRY_POINTS_12030(PGK_RESOLVE_OPTIONAL)
#undef PGK_RESOLVE_OPTIONAL
  return "";
}

}  // namespace

const cu::DriverApi& driver() {
  if (const cu::DriverApi* api = g_loaded.load(std::memory_order_acquire)) return *api;
  LoadState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.attempted) {
    s.attempted = true;
    s.error = load_into(s.api);
    if (s.error.empty()) {
      s.init_result = s.api.cuInit(0);
      if (s.init_result == cu::kSuccess) {
        g_loaded.store(&s.api, std::memory_order_release);
        return s.api;
      }
    }
  }
  if (!s.error.empty()) throw CudaError("load libcuda", -1, s.error);
  // cuInit failed (e.g. no device): the table is usable for error names only.
  const char* name = nullptr;
  if (s.api.cuGetErrorName(s.init_result, &name) != cu::kSuccess) name = "unknown";
  throw CudaError("cuInit", s.init_result, std::string("cuInit failed: ") + name);
}

const cu::DriverApi* driver_if_loaded() {
  if (const cu::DriverApi* api = g_loaded.load(std::memory_order_acquire)) return api;
  LoadState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  // After a failed cuInit the table is complete and error names are still available.
  if (s.attempted && s.error.empty()) return &s.api;
  return nullptr;
}

std::string driver_unavailable_reason() {
  try {
    const cu::DriverApi& api = driver();
    int count = 0;
    CUresult r = api.cuDeviceGetCount(&count);
    if (r != cu::kSuccess) return "cuDeviceGetCount failed with code " + std::to_string(r);
    if (count == 0) return "no CUDA device";
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace pgk
