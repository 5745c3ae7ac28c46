// C++ exceptions of the native layer. A translator registered in errors.cpp turns them into
// the Python classes of pygpukit.errors, imported when raised, so there is one hierarchy.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "cuda_api.h"

namespace pgk {

class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& call, CUresult code, const std::string& message)
      : std::runtime_error(message), call_(call), code_(code) {}
  const std::string& call() const { return call_; }
  CUresult code() const { return code_; }

 private:
  std::string call_;
  CUresult code_;
};

class CompileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds the message from cuGetErrorName/String and throws CudaError when result != 0.
void check(CUresult result, const char* call);

inline void check_cu(CUresult result, const char* call) {
  if (result != cu::kSuccess) check(result, call);
}

void register_errors(pybind11::module_& m);

}  // namespace pgk
