// NVRTC loaded at run time from candidate paths computed in Python.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

namespace pgk {

// Tries each path with dlopen; the first that loads and has every entry point wins. Later
// calls return the loaded path. Throws CompileError listing what was tried.
std::string nvrtc_load(const std::vector<std::string>& candidates);
bool nvrtc_loaded();
std::string nvrtc_path();
std::pair<int, int> nvrtc_version();
std::vector<int> nvrtc_supported_archs();

// Compiles to CUBIN (the options must name an sm_ architecture). Needs no GIL. Throws
// CompileError with the log and the quoted offending source lines.
std::string nvrtc_compile(const std::string& source, const std::string& name,
                          const std::vector<std::string>& options, const std::string& arch);

// The message of a failed compile: the log, then the source lines it points at.
std::string format_compile_error(const std::string& source, const std::string& name,
                                 const std::string& arch, const std::string& status,
                                 const std::string& log);

void register_nvrtc(pybind11::module_& m);

}  // namespace pgk
