#include "capi_launch.h"

#include "driver.h"
#include "graph.h"

namespace py = pybind11;

namespace {

constexpr unsigned kEventDisableTiming = 0x2;
constexpr int kNotReady = 600;

// The context a launch needs, made current only when it is not (one TLS read otherwise).
int make_current(uint64_t ctx) {
  const auto& api = pgk::driver();
  CUcontext cur = nullptr;
  CUcontext want = reinterpret_cast<CUcontext>(static_cast<uintptr_t>(ctx));
  int rc = api.cuCtxGetCurrent(&cur);
  if (rc != 0) return rc;
  return cur == want ? 0 : api.cuCtxSetCurrent(want);
}

CUstream as_stream(uint64_t s) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(s)); }
CUevent as_event(uint64_t e) { return reinterpret_cast<CUevent>(static_cast<uintptr_t>(e)); }

int capi_launch(uint64_t ctx, uint64_t func, const uint32_t* g, const uint32_t* b,
                uint32_t shared_mem, uint64_t stream, int pdl, void** params) {
  int rc = make_current(ctx);
  if (rc != 0) return rc;
  const auto& api = pgk::driver();
  CUfunction f = reinterpret_cast<CUfunction>(static_cast<uintptr_t>(func));
  if (pdl) {
    pgk::cu::LaunchAttribute attr{};
    attr.id = pgk::cu::kLaunchAttrProgrammaticStreamSerialization;
    attr.value = 1;
    pgk::cu::LaunchConfig cfg{g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, as_stream(stream),
                         &attr, 1};
    return api.cuLaunchKernelEx(&cfg, f, params, nullptr);
  }
  return api.cuLaunchKernel(f, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, as_stream(stream),
                            params, nullptr);
}

int capi_event_create(uint64_t ctx, uint64_t* out) {
  int rc = make_current(ctx);
  if (rc != 0) return rc;
  CUevent e = nullptr;
  rc = pgk::driver().cuEventCreate(&e, kEventDisableTiming);
  *out = reinterpret_cast<uintptr_t>(e);
  return rc;
}

int capi_event_record(uint64_t e, uint64_t stream) {
  return pgk::driver().cuEventRecord(as_event(e), as_stream(stream));
}

int capi_event_query(uint64_t e) { return pgk::driver().cuEventQuery(as_event(e)); }

int capi_event_synchronize(uint64_t e) {
  // Blocking: the caller (the controller, under the GIL) is at its in-flight bound.
  return pgk::driver().cuEventSynchronize(as_event(e));
}

int capi_event_destroy(uint64_t e) { return pgk::driver().cuEventDestroy(as_event(e)); }

int capi_graph_launch(uint64_t exec, uint64_t stream) {
  CUgraphExec g = reinterpret_cast<CUgraphExec>(static_cast<uintptr_t>(exec));
  // A kernel replaced by its optimised build since the last launch (graph.h).
  int rc = pgk::apply_replacements(g);
  if (rc != 0) return rc;
  return pgk::driver().cuGraphLaunch(g, as_stream(stream));
}

const char* capi_error_string(int code) {
  if (code == kNotReady) return "CUDA_ERROR_NOT_READY";
  const pgk::cu::DriverApi* api = pgk::driver_if_loaded();
  const char* s = nullptr;
  if (api && api->cuGetErrorString(static_cast<CUresult>(code), &s) == 0 && s) return s;
  return "unknown CUDA error";
}

const PgkLaunchCapi kCapi = {
    PGK_LAUNCH_CAPI_VERSION, sizeof(PgkLaunchCapi), capi_launch,           capi_event_create,
    capi_event_record,       capi_event_query,      capi_event_synchronize, capi_event_destroy,
    capi_error_string,       capi_graph_launch,
};

PyObject* g_recorder = nullptr;  // owned reference, or null

}  // namespace

namespace pgk {

PyObject* launch_recorder() { return g_recorder; }

void register_launch_capi(py::module_& m) {
  m.def(
      "launch_capi",
      []() {
        driver();  // loads libcuda (raises without a driver), so the table's entries work
        return py::capsule(static_cast<const void*>(&kCapi), PGK_LAUNCH_CAPI_NAME);
      },
      "The launch C ABI table (a PyCapsule) for _rust.register_launch_capi.");
  m.def(
      "set_launch_recorder",
      [](py::object fn) {
        PyObject* old = g_recorder;
        g_recorder = fn.is_none() ? nullptr : fn.inc_ref().ptr();
        Py_XDECREF(old);
      },
      py::arg("recorder"),
      "recorder(function, grid, block, fmt, args, shared_mem, pdl) is called after every "
      "Function.launch until set_launch_recorder(None) (the dispatch controller's plan "
      "recording).");
}

}  // namespace pgk
