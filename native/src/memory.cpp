#include "memory.h"

#include <string>

#include "context.h"
#include "driver.h"
#include "errors.h"
#include "stream.h"

namespace py = pybind11;

namespace pgk {
namespace {

// A contiguous view of a host object (numpy array, bytes, HostBuffer), released on scope exit.
class HostView {
 public:
  HostView(py::handle obj, bool writable) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw py::error_already_set();
  }
  ~HostView() { PyBuffer_Release(&view_); }
  HostView(const HostView&) = delete;
  HostView& operator=(const HostView&) = delete;
  void* data() const { return view_.buf; }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

bool is_pinned(const void* p) {
  unsigned type = 0;
  CUresult r = driver().cuPointerGetAttribute(&type, cu::kPointerAttrMemoryType,
                                              reinterpret_cast<CUdeviceptr>(p));
  // Pageable memory is unknown to the driver and answers CUDA_ERROR_INVALID_VALUE.
  return r == cu::kSuccess && type == cu::kMemoryTypeHost;
}

size_t copy_size(size_t host_bytes, const py::object& nbytes) {
  if (nbytes.is_none()) return host_bytes;
  size_t n = nbytes.cast<size_t>();
  if (n > host_bytes) {
    throw py::value_error("nbytes=" + std::to_string(n) + " exceeds the host buffer (" +
                          std::to_string(host_bytes) + " bytes)");
  }
  return n;
}

void refuse_capture(CUstream s, const char* what) {
  if (stream_is_capturing(s)) {
    throw CudaError(what, cu::kErrorInvalidValue,
                    std::string(what) +
                        ": copies from pageable host memory cannot be captured into a graph; "
                        "copy before capturing or use a HostBuffer");
  }
}

// Raw copies for tests and small internal reads (the error word). The product's copies go
// through the Rust transfer engine (transfers.py), which owns the pinned staging; here a
// pageable buffer is left to the driver, whose pageable copies return once the source may
// be reused (host to device) or once the data has landed (device to host). A pinned buffer
// is copied asynchronously: the caller keeps it alive until the stream reaches the copy.
void htod(CUdeviceptr dst, py::handle src, const py::object& nbytes, CUstream s, bool sync) {
  current_context();
  HostView view(src, false);
  size_t n = copy_size(view.size(), nbytes);
  if (n == 0) return;
  bool pinned = is_pinned(view.data());
  if (!pinned) refuse_capture(s, "memcpy_htod");
  py::gil_scoped_release nogil;
  check_cu(driver().cuMemcpyHtoDAsync(dst, view.data(), n, s), "cuMemcpyHtoDAsync");
  if (sync) check_cu(driver().cuStreamSynchronize(s), "cuStreamSynchronize");
}

void dtoh(py::handle dst, CUdeviceptr src, const py::object& nbytes, CUstream s, bool sync) {
  current_context();
  HostView view(dst, true);
  size_t n = copy_size(view.size(), nbytes);
  if (n == 0) return;
  bool pinned = is_pinned(view.data());
  if (!pinned) refuse_capture(s, "memcpy_dtoh");
  py::gil_scoped_release nogil;
  check_cu(driver().cuMemcpyDtoHAsync(view.data(), src, n, s), "cuMemcpyDtoHAsync");
  if (sync) check_cu(driver().cuStreamSynchronize(s), "cuStreamSynchronize");
}

void dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, bool sync) {
  current_context();
  check_cu(driver().cuMemcpyDtoDAsync(dst, src, n, s), "cuMemcpyDtoDAsync");
  if (sync) {
    py::gil_scoped_release nogil;
    check_cu(driver().cuStreamSynchronize(s), "cuStreamSynchronize");
  }
}

}  // namespace

void register_memory(py::module_& m) {
  m.def(
      "mem_alloc",
      [](size_t nbytes) {
        current_context();
        CUdeviceptr p = 0;
        check_cu(driver().cuMemAlloc(&p, nbytes), "cuMemAlloc");
        return static_cast<uint64_t>(p);
      },
      py::arg("nbytes"), "Allocate device memory; returns the pointer as an int.");
  m.def(
      "mem_free",
      [](uint64_t ptr) {
        current_context();
        check_cu(driver().cuMemFree(ptr), "cuMemFree");
      },
      py::arg("ptr"));
  m.def(
      "mem_get_info",
      []() {
        current_context();
        size_t free_b = 0, total = 0;
        check_cu(driver().cuMemGetInfo(&free_b, &total), "cuMemGetInfo");
        return py::make_tuple(free_b, total);
      },
      "(free, total) bytes of the current device.");
  m.def(
      "memset",
      [](uint64_t ptr, unsigned char value, size_t nbytes, py::handle stream) {
        current_context();
        check_cu(driver().cuMemsetD8Async(ptr, value, nbytes, stream_handle(stream)),
                 "cuMemsetD8Async");
      },
      py::arg("ptr"), py::arg("value"), py::arg("nbytes"), py::arg("stream") = py::none(),
      "Set nbytes bytes to value, ordered on stream.");
  m.def(
      "memset_d32",
      [](uint64_t ptr, uint32_t value, size_t count, py::handle stream) {
        current_context();
        check_cu(driver().cuMemsetD32Async(ptr, value, count, stream_handle(stream)),
                 "cuMemsetD32Async");
      },
      py::arg("ptr"), py::arg("value"), py::arg("count"), py::arg("stream") = py::none(),
      "Set count 32-bit words to value, ordered on stream.");

  for (bool sync : {false, true}) {
    std::string suffix = sync ? "" : "_async";
    m.def(("memcpy_htod" + suffix).c_str(),
          [sync](uint64_t dst, py::handle src, py::handle stream, py::object nbytes) {
            htod(dst, src, nbytes, stream_handle(stream), sync);
          },
          py::arg("dst"), py::arg("src"), py::arg("stream") = py::none(),
          py::arg("nbytes") = py::none(),
          "Copy a host buffer to device memory. A pageable source may be reused as soon as "
          "this returns; a HostBuffer source must live until the stream passes the copy.");
    m.def(("memcpy_dtoh" + suffix).c_str(),
          [sync](py::handle dst, uint64_t src, py::handle stream, py::object nbytes) {
            dtoh(dst, src, nbytes, stream_handle(stream), sync);
          },
          py::arg("dst"), py::arg("src"), py::arg("stream") = py::none(),
          py::arg("nbytes") = py::none(),
          "Copy device memory into a writable host buffer. Unless dst is a HostBuffer this "
          "returns once dst holds the data, even in the _async form.");
    m.def(("memcpy_dtod" + suffix).c_str(),
          [sync](uint64_t dst, uint64_t src, size_t nbytes, py::handle stream) {
            dtod(dst, src, nbytes, stream_handle(stream), sync);
          },
          py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("stream") = py::none());
  }

}

}  // namespace pgk
