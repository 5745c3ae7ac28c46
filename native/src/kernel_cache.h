// Compiled-kernel cache: an in-memory map in front of a directory of CUBIN entries.
//
// Entry file: magic (8 bytes) | payload length (u64 LE) | key (32 bytes) | SHA-256 of payload
// | payload. The key in the header binds the entry to its name, so an entry copied or renamed
// onto another key is a miss. Written to a temp file then renamed, so readers see whole entries
// or none; the checksum still catches truncation by a crash before the data reached the disk.
// Only regular files owned by this user, of a bounded size, are read. Bad entries are deleted
// and recompiled. The directory must be owned by this user and not world-writable (else a
// private fallback directory is used and a warning says so once). It is pruned to a byte
// bound, least recently used first (mtime is the access time: hits touch it, because atime is
// often disabled).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pgk {

struct CacheRequest {
  std::string source;
  std::string arch;  // sm_XX
  std::vector<std::string> options;
  std::vector<std::string> include_dirs;
  std::string name = "kernel.cu";
  std::string package_version;
  // Digests of files the source includes (gpk.jit's headers), so editing one changes the key.
  std::vector<std::string> dependencies;
};

struct CacheEntryInfo {
  std::string key;
  uint64_t size;
  double mtime;
};

// The hex SHA-256 of everything that determines the CUBIN (NVRTC must be loaded).
std::string cache_key(const CacheRequest& req);
// Compiles through the cache; needs no GIL.
std::string compile_cached(const CacheRequest& req, bool use_cache);
// The cached CUBIN (memory, then disk) or nothing; compiles nothing. Needs no GIL.
std::optional<std::string> lookup_cached(const CacheRequest& req);

// The directory the settings name, and the one in use after the ownership checks.
std::string cache_dir_setting();
std::string cache_dir();
uint64_t cache_max_bytes();
// The settings above, from Python's pygpukit.settings (dir "" keeps the XDG default).
void configure_cache(const std::string& dir, uint64_t max_bytes);
std::vector<CacheEntryInfo> cache_list();
size_t cache_clear();

void register_kernel_cache(pybind11::module_& m);

}  // namespace pgk
