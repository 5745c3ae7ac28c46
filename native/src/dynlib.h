// Run-time loading of optional CUDA libraries (NVRTC, cuBLASLt): the first candidate path
// whose entry points all resolve wins, and every failure is kept for the error message.
#pragma once

#include <dlfcn.h>

#include <optional>
#include <string>
#include <vector>

namespace pgk {

// Looks up `name` in `lib` into `fn`; a missing symbol is appended to `missing`.
template <class Fn>
void resolve_symbol(void* lib, const char* name, Fn& fn, std::string* missing) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!fn) *missing += std::string(missing->empty() ? "" : ", ") + name;
}

// `resolve(lib, &missing)` fills the caller's entry-point table from an opened library and
// lists what it lacks; on success the library stays open for the life of the process.
template <class Resolve>
std::optional<std::string> open_first(const std::vector<std::string>& candidates, Resolve resolve,
                                      std::string* tried) {
  for (const std::string& path : candidates) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      *tried += "\n  " + path + ": " + (why ? why : "dlopen failed");
      continue;
    }
    std::string missing;
    resolve(lib, &missing);
    if (missing.empty()) return path;
    *tried += "\n  " + path + ": missing " + missing;
    dlclose(lib);
  }
  return std::nullopt;
}

}  // namespace pgk
