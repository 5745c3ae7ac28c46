#include "kernel_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <pybind11/stl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "errors.h"
#include "nvrtc.h"
#include "sha256.h"

namespace py = pybind11;

namespace pgk {
namespace {

constexpr char kMagic[8] = {'P', 'G', 'K', 'C', 'U', 'B', 'N', '2'};
constexpr size_t kKeyOffset = 16;
constexpr size_t kSumOffset = kKeyOffset + 32;
constexpr size_t kHeaderBytes = kSumOffset + 32;
// No CUBIN comes near this; a bigger entry (a huge sparse file) is refused unread.
constexpr uint64_t kMaxPayloadBytes = uint64_t{64} << 20;
constexpr uint64_t kDefaultMaxBytes = uint64_t{256} << 20;
constexpr const char* kSuffix = ".cubin";

using Digest = std::array<uint8_t, 32>;

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

// Warnings about refused directories: each directory is reported once, and the Python
// bindings turn pending ones into RuntimeWarnings once they hold the GIL again.
std::mutex g_notice_mu;
std::set<std::string>& noticed_dirs() {
  static auto* s = new std::set<std::string>();
  return *s;
}
std::vector<std::string>& pending_notices() {
  static auto* v = new std::vector<std::string>();
  return *v;
}

void notice_once(const std::string& dir, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_notice_mu);
  if (noticed_dirs().insert(dir).second) pending_notices().push_back(message);
}

std::vector<std::string> take_notices() {
  std::lock_guard<std::mutex> lock(g_notice_mu);
  std::vector<std::string> out;
  out.swap(pending_notices());
  return out;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

enum class DirState { kOk, kUnavailable, kRefused };

// Creates missing components with mode 0700. Compiled code loaded from the leaf runs on the
// GPU with the user's privileges, so a leaf owned by someone else, or one anybody could have
// written to, is refused (why says why); a leaf of ours that is merely readable by others is
// made private. follow_leaf: whether the leaf may be a symlink to the directory.
DirState prepare_dir(const std::string& path, bool follow_leaf, std::string& why) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string part = path.substr(0, pos);
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      why = "cannot create " + part + ": " + std::strerror(errno);
      return DirState::kUnavailable;
    }
  }
  struct stat st;
  int got = follow_leaf ? stat(path.c_str(), &st) : lstat(path.c_str(), &st);
  if (got != 0 || !S_ISDIR(st.st_mode)) {
    why = "it is not a directory";
    return DirState::kUnavailable;
  }
  if (st.st_uid != geteuid()) {
    why = "it is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
          std::to_string(geteuid()) + ")";
    return DirState::kRefused;
  }
  if (st.st_mode & S_IWOTH) {
    why = "it is world-writable (mode " + octal_mode(st.st_mode) + ")";
    return DirState::kRefused;
  }
  if ((st.st_mode & 0777) != 0700) chmod(path.c_str(), 0700);
  return DirState::kOk;
}

// Per-user directory right under TMPDIR (whose sticky bit keeps others from renaming it),
// used when the configured one is refused. Never a symlink: others can plant those there.
std::string fallback_dir() {
  std::string tmp = env("TMPDIR");
  if (tmp.empty() || tmp[0] != '/') tmp = "/tmp";
  return tmp + "/pygpukit-kernels-" + std::to_string(geteuid());
}

struct ActiveDir {
  std::string path;
  bool usable;
};

ActiveDir active_dir() {
  std::string configured = cache_dir_setting();
  std::string why;
  DirState state = prepare_dir(configured, true, why);
  if (state != DirState::kRefused) return {configured, state == DirState::kOk};
  std::string fallback = fallback_dir();
  std::string fallback_why;
  bool usable =
      fallback != configured && prepare_dir(fallback, false, fallback_why) == DirState::kOk;
  std::string message = "pygpukit kernel cache: not using " + configured + " because " + why;
  if (usable) {
    message += "; using the private directory " + fallback + " instead";
  } else {
    message += "; " + fallback + " is not usable either (" + fallback_why +
               "), so compiled kernels are cached in memory only";
  }
  notice_once(configured, message);
  return {fallback, usable};
}

std::string entry_path(const std::string& dir, const std::string& key) {
  return dir + "/" + key + kSuffix;
}

// An entry is only worth opening if it is a regular file (a symlink could point anywhere, a
// FIFO would block the read), ours, and of a size a real entry can have.
bool plausible_entry(const struct stat& st) {
  return S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
         static_cast<uint64_t>(st.st_size) >= kHeaderBytes &&
         static_cast<uint64_t>(st.st_size) <= kHeaderBytes + kMaxPayloadBytes;
}

enum class EntryState { kMissing, kBad, kGood };

// Reads the entry for key into payload; kBad when the file exists but fails any check.
// A good entry's mtime is set to now: hits make it the newest for pruning.
EntryState read_entry(const std::string& path, const Digest& key, std::string& payload) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? EntryState::kMissing : EntryState::kBad;
  }
  if (!plausible_entry(st)) return EntryState::kBad;
  // O_NOFOLLOW and O_NONBLOCK: the name may have been swapped for a symlink or a FIFO since.
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? EntryState::kMissing : EntryState::kBad;
  std::string data;
  bool ok = fstat(fd, &st) == 0 && plausible_entry(st);
  if (ok) {
    data.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < data.size()) {
      ssize_t n = read(fd, &data[got], data.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ok = got == data.size();
  }
  if (ok) ok = std::memcmp(data.data(), kMagic, 8) == 0;
  uint64_t len = 0;
  if (ok) {
    for (int i = 0; i < 8; ++i) len |= uint64_t{static_cast<uint8_t>(data[8 + i])} << (8 * i);
    ok = len == data.size() - kHeaderBytes;
  }
  if (ok) ok = std::memcmp(data.data() + kKeyOffset, key.data(), key.size()) == 0;
  if (ok) {
    auto sum = sha256(data.data() + kHeaderBytes, len);
    ok = std::memcmp(sum.data(), data.data() + kSumOffset, sum.size()) == 0;
  }
  if (ok) futimens(fd, nullptr);
  close(fd);
  if (!ok) return EntryState::kBad;
  payload = data.substr(kHeaderBytes);
  return EntryState::kGood;
}

bool write_entry(const std::string& dir, const std::string& key_hex, const Digest& key,
                 const std::string& payload) {
  if (payload.size() > kMaxPayloadBytes) return false;  // would be refused on reading
  static std::atomic<uint64_t> counter{0};
  std::string tmp =
      dir + "/.tmp-" + key_hex + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::string data(kMagic, 8);
  uint64_t len = payload.size();
  for (int i = 0; i < 8; ++i) data.push_back(static_cast<char>(len >> (8 * i)));
  data.append(reinterpret_cast<const char*>(key.data()), key.size());
  auto sum = sha256(payload.data(), payload.size());
  data.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  data += payload;
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bool ok = close(fd) == 0 && done == data.size();
  // rename replaces the name atomically, whatever it was (a bad entry, a symlink, a FIFO).
  if (ok) ok = rename(tmp.c_str(), entry_path(dir, key_hex).c_str()) == 0;
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
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
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

std::string cache_dir_setting() {
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

std::string cache_dir() { return active_dir().path; }

uint64_t cache_max_bytes() {
  std::lock_guard<std::mutex> lock(g_config_mu);
  return g_max_bytes_setting;
}

void configure_cache(const std::string& dir, uint64_t max_bytes) {
  std::lock_guard<std::mutex> lock(g_config_mu);
  g_dir_setting = dir;
  g_max_bytes_setting = max_bytes;
}

namespace {

Digest key_digest(const CacheRequest& req) {
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
  h.update_field(std::to_string(req.dependencies.size()));
  for (const auto& d : req.dependencies) h.update_field(d);
  return h.digest();
}

}  // namespace

std::string cache_key(const CacheRequest& req) {
  Digest digest = key_digest(req);
  return to_hex(digest.data(), digest.size());
}

namespace {

void check_arch(const CacheRequest& req) {
  if (req.arch.rfind("sm_", 0) != 0) {
    throw CompileError(
        "arch must be a real architecture like 'sm_90' (CUBIN only, never PTX), got '" + req.arch +
        "'");
  }
}

// The cached CUBIN of key (memory, then the disk entry at path in dir), or nothing.
std::optional<std::string> find_cached(const std::string& key, const Digest& key_bytes,
                                       const ActiveDir& dir, const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    auto it = memory().find(key);
    if (it != memory().end()) {
      g_stats.memory_hits++;
      return it->second;
    }
  }
  if (!dir.usable) g_stats.disk_errors++;
  if (dir.usable) {
    std::string cubin;
    EntryState state = read_entry(path, key_bytes, cubin);
    if (state == EntryState::kGood) {
      g_stats.disk_hits++;
      remember(key, cubin);
      return cubin;
    }
    if (state == EntryState::kBad) {
      // A miss: the entry is recompiled and the name replaced (unlink removes a symlink
      // itself, never its target).
      g_stats.corrupt++;
      unlink(path.c_str());
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> lookup_cached(const CacheRequest& req) {
  check_arch(req);
  Digest key_bytes = key_digest(req);
  std::string key = to_hex(key_bytes.data(), key_bytes.size());
  ActiveDir dir = active_dir();
  return find_cached(key, key_bytes, dir, entry_path(dir.path, key));
}

std::string compile_cached(const CacheRequest& req, bool use_cache) {
  check_arch(req);
  std::vector<std::string> options = req.options;
  options.push_back("--gpu-architecture=" + req.arch);
  for (const auto& d : req.include_dirs) options.push_back("-I" + d);
  if (!use_cache) {
    g_stats.compiles++;
    return nvrtc_compile(req.source, req.name, options, req.arch);
  }

  Digest key_bytes = key_digest(req);
  std::string key = to_hex(key_bytes.data(), key_bytes.size());
  ActiveDir dir = active_dir();
  std::string path = entry_path(dir.path, key);
  if (std::optional<std::string> hit = find_cached(key, key_bytes, dir, path)) return *hit;
  std::string cubin = nvrtc_compile(req.source, req.name, options, req.arch);
  g_stats.compiles++;
  remember(key, cubin);
  if (dir.usable) {
    // The disk is a best-effort layer: a full or read-only disk must not fail compiles.
    if (write_entry(dir.path, key, key_bytes, cubin)) {
      g_stats.writes++;
      prune(dir.path, cache_max_bytes());
    } else {
      g_stats.disk_errors++;
    }
  }
  return cubin;
}

std::vector<CacheEntryInfo> cache_list() {
  ActiveDir dir = active_dir();
  // An unusable directory may be a planted link to anywhere: nothing there is ours to list.
  std::vector<DiskEntry> entries = dir.usable ? scan(dir.path) : std::vector<DiskEntry>{};
  std::sort(entries.begin(), entries.end(),
            [](const DiskEntry& a, const DiskEntry& b) { return a.mtime_ns > b.mtime_ns; });
  std::vector<CacheEntryInfo> out;
  for (const auto& e : entries) out.push_back({e.key, e.size, e.mtime_ns / 1e9});
  return out;
}

size_t cache_clear() {
  ActiveDir dir = active_dir();
  size_t removed = 0;
  // Every non-directory entry name (symlinks and FIFOs too), and the temp files of writers
  // that died mid-write; nothing in an unusable directory (it may be a planted link).
  if (DIR* d = dir.usable ? opendir(dir.path.c_str()) : nullptr) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      bool entry = name[0] != '.' && ends_with(name, kSuffix);
      if (!entry && name.compare(0, 5, ".tmp-") != 0) continue;
      std::string path = dir.path + "/" + name;
      struct stat st;
      if (lstat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
      if (unlink(path.c_str()) == 0 && entry) removed++;
    }
    closedir(d);
  }
  std::lock_guard<std::mutex> lock(g_mem_mu);
  memory().clear();
  return removed;
}

namespace {

// Turns refused-directory notices into RuntimeWarnings (the GIL must be held).
void warn_pending_notices() {
  for (const auto& message : take_notices()) {
    if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) {
      throw py::error_already_set();
    }
  }
}

}  // namespace

void register_kernel_cache(py::module_& m) {
  using Strings = std::vector<std::string>;
  auto request = [](const std::string& source, const std::string& arch, const Strings& options,
                    const Strings& include_dirs, const std::string& name,
                    const Strings& dependencies) {
    CacheRequest r{source, arch, options, include_dirs, name, "", dependencies};
    r.package_version = py::str(py::module_::import("pygpukit").attr("__version__"));
    return r;
  };
  m.def(
      "compile_cubin",
      [request](const std::string& source, const std::string& arch, const Strings& options,
                const Strings& include_dirs, const std::string& name, bool use_cache,
                const Strings& dependencies) {
        CacheRequest r = request(source, arch, options, include_dirs, name, dependencies);
        std::string cubin;
        {
          py::gil_scoped_release nogil;
          cubin = compile_cached(r, use_cache);
        }
        warn_pending_notices();
        return py::bytes(cubin);
      },
      py::arg("source"), py::arg("arch"), py::arg("options") = Strings{},
      py::arg("include_dirs") = Strings{}, py::arg("name") = "kernel.cu",
      py::arg("use_cache") = true, py::arg("dependencies") = Strings{},
      "Compile CUDA C++ to CUBIN for arch (sm_XX) through the memory and disk caches.\n"
      "dependencies: strings (digests of included files) hashed into the cache key.");
  m.def(
      "kernel_cache_lookup",
      [request](const std::string& source, const std::string& arch, const Strings& options,
                const Strings& include_dirs, const std::string& name,
                const Strings& dependencies) -> py::object {
        CacheRequest r = request(source, arch, options, include_dirs, name, dependencies);
        std::optional<std::string> cubin;
        {
          py::gil_scoped_release nogil;
          cubin = lookup_cached(r);
        }
        warn_pending_notices();
        if (!cubin) return py::none();
        return py::bytes(*cubin);
      },
      py::arg("source"), py::arg("arch"), py::arg("options") = Strings{},
      py::arg("include_dirs") = Strings{}, py::arg("name") = "kernel.cu",
      py::arg("dependencies") = Strings{},
      "compile_cubin's CUBIN where the memory or disk cache holds it, else None (compiles "
      "nothing).");
  m.def(
      "kernel_cache_key",
      [request](const std::string& source, const std::string& arch, const Strings& options,
                const Strings& include_dirs, const std::string& name, const Strings& dependencies) {
        return cache_key(request(source, arch, options, include_dirs, name, dependencies));
      },
      py::arg("source"), py::arg("arch"), py::arg("options") = Strings{},
      py::arg("include_dirs") = Strings{}, py::arg("name") = "kernel.cu",
      py::arg("dependencies") = Strings{});
  m.def("kernel_cache_configure", &configure_cache, py::arg("dir"), py::arg("max_bytes"),
        "Set the cache directory (\"\": the XDG default) and its size bound in bytes.");
  m.def(
      "kernel_cache_dir",
      []() {
        std::string dir = cache_dir();
        warn_pending_notices();
        return dir;
      },
      "The directory in use: the configured one, or the private fallback if it was refused.");
  m.def("kernel_cache_max_bytes", &cache_max_bytes);
  m.def(
      "kernel_cache_list",
      []() {
        py::list out;
        for (const auto& e : cache_list()) out.append(py::make_tuple(e.key, e.size, e.mtime));
        warn_pending_notices();
        return out;
      },
      "[(key, size, mtime)] of the disk entries, newest first.");
  m.def(
      "kernel_cache_clear",
      []() {
        size_t removed = cache_clear();
        warn_pending_notices();
        return removed;
      },
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
