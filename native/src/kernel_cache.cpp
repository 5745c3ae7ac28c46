#include "kernel_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <pybind11/stl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "errors.h"
#include "nvrtc.h"
#include "sha256.h"

namespace py = pybind11;

namespace pgk {
namespace {

constexpr char kMagic[8] = {'P', 'G', 'K', 'C', 'U', 'B', 'N', '1'};
constexpr size_t kHeaderBytes = 8 + 8 + 32;
constexpr uint64_t kDefaultMaxBytes = uint64_t{256} << 20;
constexpr const char* kSuffix = ".cubin";

struct Stats {
  std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, compiles{0}, corrupt{0}, writes{0}, pruned{0},
      disk_errors{0};
};
Stats g_stats;

std::mutex g_mem_mu;
std::unordered_map<std::string, std::string>& memory() {
  static auto* m = new std::unordered_map<std::string, std::string>();
  return *m;
}

// The PYGPUKIT_CACHE_DIR / PYGPUKIT_CACHE_MAX_BYTES settings, handed over by Python
// (pygpukit.settings owns them; toolchain.configure_kernel_cache runs before each use).
std::mutex g_config_mu;
std::string g_dir_setting;  // "": the XDG default below
uint64_t g_max_bytes_setting = kDefaultMaxBytes;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Creates missing components with mode 0700 and forces the leaf to 0700, since compiled
// code loaded from here runs on the GPU with the user's privileges.
bool ensure_dir(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string part = path.substr(0, pos);
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  if ((st.st_mode & 0777) != 0700 && st.st_uid == geteuid()) chmod(path.c_str(), 0700);
  return true;
}

std::string entry_path(const std::string& dir, const std::string& key) {
  return dir + "/" + key + kSuffix;
}

bool read_all(const std::string& path, std::string& out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = fstat(fd, &st) == 0;
  if (ok) {
    out.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < out.size()) {
      ssize_t n = read(fd, &out[got], out.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
  }
  close(fd);
  return ok;
}

// nullopt when missing; "corrupt" is set when the file exists but fails its checks.
std::optional<std::string> read_entry(const std::string& path, bool& corrupt) {
  corrupt = false;
  std::string data;
  if (!read_all(path, data)) return std::nullopt;
  uint64_t len = 0;
  bool ok = data.size() >= kHeaderBytes && std::memcmp(data.data(), kMagic, 8) == 0;
  if (ok) {
    for (int i = 0; i < 8; ++i) len |= uint64_t{static_cast<uint8_t>(data[8 + i])} << (8 * i);
    ok = len == data.size() - kHeaderBytes;
  }
  if (ok) {
    auto sum = sha256(data.data() + kHeaderBytes, len);
    ok = std::memcmp(sum.data(), data.data() + 16, 32) == 0;
  }
  if (!ok) {
    corrupt = true;
    return std::nullopt;
  }
  return data.substr(kHeaderBytes);
}

bool write_entry(const std::string& dir, const std::string& key, const std::string& payload) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp =
      dir + "/.tmp-" + key + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::string data(kMagic, 8);
  uint64_t len = payload.size();
  for (int i = 0; i < 8; ++i) data.push_back(static_cast<char>(len >> (8 * i)));
  auto sum = sha256(payload.data(), payload.size());
  data.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  data += payload;
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bool ok = close(fd) == 0 && done == data.size();
  if (ok) ok = rename(tmp.c_str(), entry_path(dir, key).c_str()) == 0;
  if (!ok) unlink(tmp.c_str());
  return ok;
}

struct DiskEntry {
  std::string path;
  std::string key;
  uint64_t size;
  int64_t mtime_ns;
};

std::vector<DiskEntry> scan(const std::string& dir) {
  std::vector<DiskEntry> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name[0] == '.' || !ends_with(name, kSuffix)) continue;
    std::string path = dir + "/" + name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    int64_t ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    out.push_back({path, name.substr(0, name.size() - std::strlen(kSuffix)),
                   static_cast<uint64_t>(st.st_size), ns});
  }
  closedir(d);
  return out;
}

void prune(const std::string& dir, uint64_t max_bytes) {
  std::vector<DiskEntry> entries = scan(dir);
  uint64_t total = 0;
  for (const auto& e : entries) total += e.size;
  if (total <= max_bytes) return;
  std::sort(entries.begin(), entries.end(),
            [](const DiskEntry& a, const DiskEntry& b) { return a.mtime_ns < b.mtime_ns; });
  for (const auto& e : entries) {
    if (total <= max_bytes) break;
    // Another process may have pruned it already; the bound holds either way.
    if (unlink(e.path.c_str()) == 0 || errno == ENOENT) {
      total -= e.size;
      g_stats.pruned++;
    }
  }
}

void remember(const std::string& key, const std::string& cubin) {
  std::lock_guard<std::mutex> lock(g_mem_mu);
  memory()[key] = cubin;
}

}  // namespace

std::string cache_dir() {
  {
    std::lock_guard<std::mutex> lock(g_config_mu);
    if (!g_dir_setting.empty()) return g_dir_setting;
  }
  std::string base = env("XDG_CACHE_HOME");
  if (base.empty() || base[0] != '/') {
    std::string home = env("HOME");
    if (home.empty()) {
      if (passwd* pw = getpwuid(getuid())) home = pw->pw_dir;
    }
    base = home + "/.cache";
  }
  return base + "/pygpukit/kernels";
}

uint64_t cache_max_bytes() {
  std::lock_guard<std::mutex> lock(g_config_mu);
  return g_max_bytes_setting;
}

void configure_cache(const std::string& dir, uint64_t max_bytes) {
  std::lock_guard<std::mutex> lock(g_config_mu);
  g_dir_setting = dir;
  g_max_bytes_setting = max_bytes;
}

std::string cache_key(const CacheRequest& req) {
  auto [major, minor] = nvrtc_version();
  Sha256 h;
  h.update_field("pygpukit-kernel-cache-v1");
  h.update_field(req.package_version);
  h.update_field(std::to_string(major) + "." + std::to_string(minor));
  h.update_field(req.arch);
  h.update_field(req.name);
  h.update_field(req.source);
  h.update_field(std::to_string(req.options.size()));
  for (const auto& o : req.options) h.update_field(o);
  h.update_field(std::to_string(req.include_dirs.size()));
  for (const auto& d : req.include_dirs) h.update_field(d);
  auto digest = h.digest();
  return to_hex(digest.data(), digest.size());
}

std::string compile_cached(const CacheRequest& req, bool use_cache) {
  if (req.arch.rfind("sm_", 0) != 0) {
    throw CompileError(
        "arch must be a real architecture like 'sm_90' (CUBIN only, never PTX), got '" + req.arch +
        "'");
  }
  std::vector<std::string> options = req.options;
  options.push_back("--gpu-architecture=" + req.arch);
  for (const auto& d : req.include_dirs) options.push_back("-I" + d);
  if (!use_cache) {
    g_stats.compiles++;
    return nvrtc_compile(req.source, req.name, options, req.arch);
  }

  std::string key = cache_key(req);
  {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    auto it = memory().find(key);
    if (it != memory().end()) {
      g_stats.memory_hits++;
      return it->second;
    }
  }
  std::string dir = cache_dir();
  bool disk = ensure_dir(dir);
  if (!disk) g_stats.disk_errors++;
  std::string path = entry_path(dir, key);
  if (disk) {
    bool corrupt = false;
    if (auto cubin = read_entry(path, corrupt)) {
      g_stats.disk_hits++;
      utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // LRU: a hit makes it the newest
      remember(key, *cubin);
      return *cubin;
    }
    if (corrupt) {
      g_stats.corrupt++;
      unlink(path.c_str());
    }
  }
  std::string cubin = nvrtc_compile(req.source, req.name, options, req.arch);
  g_stats.compiles++;
  remember(key, cubin);
  if (disk) {
    // The disk is a best-effort layer: a full or read-only disk must not fail compiles.
    if (write_entry(dir, key, cubin)) {
      g_stats.writes++;
      prune(dir, cache_max_bytes());
    } else {
      g_stats.disk_errors++;
    }
  }
  return cubin;
}

std::vector<CacheEntryInfo> cache_list() {
  std::vector<DiskEntry> entries = scan(cache_dir());
  std::sort(entries.begin(), entries.end(),
            [](const DiskEntry& a, const DiskEntry& b) { return a.mtime_ns > b.mtime_ns; });
  std::vector<CacheEntryInfo> out;
  for (const auto& e : entries) out.push_back({e.key, e.size, e.mtime_ns / 1e9});
  return out;
}

size_t cache_clear() {
  std::string dir = cache_dir();
  size_t removed = 0;
  for (const auto& e : scan(dir)) removed += unlink(e.path.c_str()) == 0;
  // Temp files of writers that died mid-write.
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, ".tmp-", 5) == 0) unlink((dir + "/" + e->d_name).c_str());
    }
    closedir(d);
  }
  std::lock_guard<std::mutex> lock(g_mem_mu);
  memory().clear();
  return removed;
}

void register_kernel_cache(py::module_& m) {
  auto request = [](const std::string& source, const std::string& arch,
                    const std::vector<std::string>& options,
                    const std::vector<std::string>& include_dirs, const std::string& name) {
    CacheRequest r{source, arch, options, include_dirs, name, ""};
    r.package_version = py::str(py::module_::import("pygpukit").attr("__version__"));
    return r;
  };
  m.def(
      "compile_cubin",
      [request](const std::string& source, const std::string& arch,
                const std::vector<std::string>& options,
                const std::vector<std::string>& include_dirs, const std::string& name,
                bool use_cache) {
        CacheRequest r = request(source, arch, options, include_dirs, name);
        std::string cubin;
        {
          py::gil_scoped_release nogil;
          cubin = compile_cached(r, use_cache);
        }
        return py::bytes(cubin);
      },
      py::arg("source"), py::arg("arch"), py::arg("options") = std::vector<std::string>{},
      py::arg("include_dirs") = std::vector<std::string>{}, py::arg("name") = "kernel.cu",
      py::arg("use_cache") = true,
      "Compile CUDA C++ to CUBIN for arch (sm_XX) through the memory and disk caches.");
  m.def(
      "kernel_cache_key",
      [request](const std::string& source, const std::string& arch,
                const std::vector<std::string>& options,
                const std::vector<std::string>& include_dirs, const std::string& name) {
        return cache_key(request(source, arch, options, include_dirs, name));
      },
      py::arg("source"), py::arg("arch"), py::arg("options") = std::vector<std::string>{},
      py::arg("include_dirs") = std::vector<std::string>{}, py::arg("name") = "kernel.cu");
  m.def("kernel_cache_configure", &configure_cache, py::arg("dir"), py::arg("max_bytes"),
        "Set the cache directory (\"\": the XDG default) and its size bound in bytes.");
  m.def("kernel_cache_dir", &cache_dir);
  m.def("kernel_cache_max_bytes", &cache_max_bytes);
  m.def(
      "kernel_cache_list",
      []() {
        py::list out;
        for (const auto& e : cache_list()) out.append(py::make_tuple(e.key, e.size, e.mtime));
        return out;
      },
      "[(key, size, mtime)] of the disk entries, newest first.");
  m.def("kernel_cache_clear", &cache_clear,
        "Delete every disk entry and forget the in-memory ones; returns how many files went.");
  m.def("kernel_cache_clear_memory", []() {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    memory().clear();
  });
  m.def("kernel_cache_stats", []() {
    py::dict d;
    d["memory_hits"] = g_stats.memory_hits.load();
    d["disk_hits"] = g_stats.disk_hits.load();
    d["compiles"] = g_stats.compiles.load();
    d["corrupt"] = g_stats.corrupt.load();
    d["writes"] = g_stats.writes.load();
    d["pruned"] = g_stats.pruned.load();
    d["disk_errors"] = g_stats.disk_errors.load();
    return d;
  });
  m.def("kernel_cache_reset_stats", []() {
    for (auto* c : {&g_stats.memory_hits, &g_stats.disk_hits, &g_stats.compiles, &g_stats.corrupt,
                    &g_stats.writes, &g_stats.pruned, &g_stats.disk_errors}) {
      c->store(0);
    }
  });
}

}  // namespace pgk
