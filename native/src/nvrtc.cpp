#include "nvrtc.h"

#include <dlfcn.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>

#include "dynlib.h"
#include "errors.h"

namespace py = pybind11;

namespace pgk {
namespace {

using nvrtcResult = int;
typedef struct _nvrtcProgram* nvrtcProgram;

#define PGK_NVRTC_ENTRY_POINTS(X)                                                           \
  X(nvrtcVersion, (int*, int*))                                                             \
  X(nvrtcGetNumSupportedArchs, (int*))                                                      \
  X(nvrtcGetSupportedArchs, (int*))                                                         \
  X(nvrtcCreateProgram,                                                                     \
    (nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*)) \
  X(nvrtcDestroyProgram, (nvrtcProgram*))                                                   \
  X(nvrtcCompileProgram, (nvrtcProgram, int, const char* const*))                           \
  X(nvrtcGetProgramLogSize, (nvrtcProgram, size_t*))                                        \
  X(nvrtcGetProgramLog, (nvrtcProgram, char*))                                              \
  X(nvrtcGetCUBINSize, (nvrtcProgram, size_t*))                                             \
  X(nvrtcGetCUBIN, (nvrtcProgram, char*))

struct NvrtcApi {
#define PGK_DECLARE(name, sig) nvrtcResult(*name) sig = nullptr;
  PGK_NVRTC_ENTRY_POINTS(PGK_DECLARE)
#undef PGK_DECLARE
  const char* (*nvrtcGetErrorString)(nvrtcResult) = nullptr;
};

std::mutex g_mu;
std::string g_path;
// Leaked on purpose: programs may be compiling on other threads at interpreter exit.
NvrtcApi* g_api_storage = new NvrtcApi();
std::atomic<const NvrtcApi*> g_api{nullptr};

const NvrtcApi& api() {
  const NvrtcApi* a = g_api.load(std::memory_order_acquire);
  if (!a) {
    throw CompileError(
        "NVRTC is not loaded; use pygpukit.backends.cuda.toolchain.compile_kernel, which "
        "finds and loads it");
  }
  return *a;
}

std::string error_string(nvrtcResult r) {
  const char* s = api().nvrtcGetErrorString(r);
  return s ? s : "NVRTC error " + std::to_string(r);
}

void check_nvrtc(nvrtcResult r, const char* call) {
  if (r != 0) throw CompileError(std::string(call) + " failed: " + error_string(r));
}

struct ProgramDeleter {
  void operator()(nvrtcProgram p) const { api().nvrtcDestroyProgram(&p); }
};
using Program = std::unique_ptr<_nvrtcProgram, ProgramDeleter>;

}  // namespace

std::string nvrtc_load(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_api.load()) return g_path;
  std::string tried;
  NvrtcApi a;
  auto resolve = [&a](void* lib, std::string* missing) {
#define PGK_RESOLVE(name, sig) pgk::resolve_symbol(lib, #name, a.name, missing);
    PGK_NVRTC_ENTRY_POINTS(PGK_RESOLVE)
#undef PGK_RESOLVE
    pgk::resolve_symbol(lib, "nvrtcGetErrorString", a.nvrtcGetErrorString, missing);
  };
  if (std::optional<std::string> path = pgk::open_first(candidates, resolve, &tried)) {
    *g_api_storage = a;
    g_path = *path;
    g_api.store(g_api_storage, std::memory_order_release);
    return g_path;
  }
  throw CompileError("cannot load NVRTC (pip install nvidia-cuda-nvrtc, or set CUDA_HOME); tried:" +
                     (tried.empty() ? std::string(" no candidates") : tried));
}

bool nvrtc_loaded() { return g_api.load() != nullptr; }

std::string nvrtc_path() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_path;
}

std::pair<int, int> nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(api().nvrtcVersion(&major, &minor), "nvrtcVersion");
  return {major, minor};
}

std::vector<int> nvrtc_supported_archs() {
  int n = 0;
  check_nvrtc(api().nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(n);
  if (n) check_nvrtc(api().nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  return archs;
}

std::string format_compile_error(const std::string& source, const std::string& name,
                                 const std::string& arch, const std::string& status,
                                 const std::string& log) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= source.size()) {
    size_t end = source.find('\n', start);
    if (end == std::string::npos) end = source.size();
    lines.push_back(source.substr(start, end - start));
    start = end + 1;
  }
  // The log names our source as "<name>(<line>): error: ..."; header lines use other names.
  std::set<size_t> hits;
  std::string needle = name + "(";
  for (size_t pos = log.find(needle); pos != std::string::npos; pos = log.find(needle, pos + 1)) {
    size_t p = pos + needle.size();
    size_t q = p;
    while (q < log.size() && std::isdigit(static_cast<unsigned char>(log[q]))) ++q;
    if (q == p || q + 1 >= log.size() || log[q] != ')' || log[q + 1] != ':') continue;
    size_t line = std::stoul(log.substr(p, q - p));
    if (line >= 1 && line <= lines.size()) hits.insert(line);
  }
  std::string msg =
      "NVRTC failed to compile " + name + " for " + arch + " (" + status + "):\n" + log;
  if (!msg.empty() && msg.back() != '\n') msg += '\n';
  if (!hits.empty()) {
    msg += "offending source lines:\n";
    size_t shown = 0;
    for (size_t line : hits) {
      if (++shown > 20) break;
      char num[16];
      std::snprintf(num, sizeof(num), "%6zu | ", line);
      msg += num + lines[line - 1] + "\n";
    }
  }
  return msg;
}

std::string nvrtc_compile(const std::string& source, const std::string& name,
                          const std::vector<std::string>& options, const std::string& arch) {
  const NvrtcApi& a = api();
  nvrtcProgram raw = nullptr;
  check_nvrtc(a.nvrtcCreateProgram(&raw, source.c_str(), name.c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  Program prog(raw);
  std::vector<const char*> opts;
  opts.reserve(options.size());
  for (const std::string& o : options) opts.push_back(o.c_str());
  nvrtcResult r = a.nvrtcCompileProgram(raw, static_cast<int>(opts.size()), opts.data());
  if (r != 0) {
    size_t log_size = 0;
    std::string log;
    if (a.nvrtcGetProgramLogSize(raw, &log_size) == 0 && log_size > 1) {
      log.resize(log_size);
      if (a.nvrtcGetProgramLog(raw, &log[0]) != 0) log.clear();
      while (!log.empty() && log.back() == '\0') log.pop_back();
    }
    throw CompileError(format_compile_error(source, name, arch, error_string(r), log));
  }
  size_t size = 0;
  check_nvrtc(a.nvrtcGetCUBINSize(raw, &size), "nvrtcGetCUBINSize");
  if (size == 0) {
    throw CompileError("NVRTC produced no CUBIN for " + arch +
                       " (the architecture must be a real sm_XX, never compute_XX)");
  }
  std::string cubin(size, '\0');
  check_nvrtc(a.nvrtcGetCUBIN(raw, &cubin[0]), "nvrtcGetCUBIN");
  return cubin;
}

void register_nvrtc(py::module_& m) {
  m.def("nvrtc_load", &nvrtc_load, py::arg("candidates"),
        "Load NVRTC from the first loadable path; returns it. Idempotent.");
  m.def("nvrtc_loaded", &nvrtc_loaded);
  m.def("nvrtc_path", &nvrtc_path, "Path NVRTC was loaded from ('' if not loaded).");
  m.def("nvrtc_version", &nvrtc_version, "(major, minor) of the loaded NVRTC.");
  m.def("nvrtc_supported_archs", &nvrtc_supported_archs,
        "SM numbers (e.g. 90) the loaded NVRTC can compile for.");
}

}  // namespace pgk
