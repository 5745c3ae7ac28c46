// Compiled-kernel cache: an in-memory map in front of a directory of CUBIN entries.
//
// Entry file: magic (8 bytes) | payload length (u64 LE) | SHA-256 of payload | payload.
// Written to a temp file then renamed, so readers see whole entries or none; the checksum
// still catches truncation by a crash before the data reached the disk. Bad entries are
// deleted and recompiled. The directory is pruned to a byte bound, least recently used first
// (mtime is the access time: hits touch it, because atime is often disabled).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
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

std::string cache_dir();
uint64_t cache_max_bytes();
// The settings above, from Python's pygpukit.settings (dir "" keeps the XDG default).
void configure_cache(const std::string& dir, uint64_t max_bytes);
std::vector<CacheEntryInfo> cache_list();
size_t cache_clear();

void register_kernel_cache(pybind11::module_& m);

}  // namespace pgk
