#include "errors.h"

#include "driver.h"

namespace py = pybind11;

namespace pgk {

void check(CUresult result, const char* call) {
  if (result == cu::kSuccess) return;
  const char* name = nullptr;
  const char* text = nullptr;
  if (const cu::DriverApi* api = driver_if_loaded()) {
    if (api->cuGetErrorName(result, &name) != cu::kSuccess) name = nullptr;
    if (api->cuGetErrorString(result, &text) != cu::kSuccess) text = nullptr;
  }
  std::string message = std::string(call) + " failed: " + (name ? name : "CUDA error") + " (" +
                        std::to_string(result) + ")";
  if (text) message += ": " + std::string(text);
  throw CudaError(call, result, message);
}

namespace {

// Raising an instance (not the class) lets the Python side read .code and .call.
void raise_python(const char* class_name, const std::string& message, const char* call, int code) {
  try {
    py::object cls = py::module_::import("pygpukit.errors").attr(class_name);
    py::object exc = cls(message);
    if (call) {
      exc.attr("call") = call;
      exc.attr("code") = code;
    }
    PyErr_SetObject(cls.ptr(), exc.ptr());
  } catch (py::error_already_set&) {
    // pygpukit.errors itself failed to import: still report the CUDA failure.
    PyErr_SetString(PyExc_RuntimeError, message.c_str());
  }
}

}  // namespace

void register_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const CudaError& e) {
      // The pool evicts and retries on OutOfMemoryError, so device OOM must be that class.
      const char* cls = e.code() == cu::kErrorOutOfMemory ? "OutOfMemoryError" : "CUDAError";
      raise_python(cls, e.what(), e.call().c_str(), e.code());
    } catch (const CompileError& e) {
      raise_python("CompileError", e.what(), nullptr, 0);
    }
  });
}

}  // namespace pgk
