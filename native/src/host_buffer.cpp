#include "host_buffer.h"

#include "driver.h"
#include "errors.h"

namespace py = pybind11;

namespace pgk {

HostBuffer::HostBuffer(size_t nbytes) : ctx_(current_context()), size_(nbytes) {
  // cuMemHostAlloc rejects 0 bytes; one byte keeps an empty buffer a valid object.
  check_cu(driver().cuMemHostAlloc(&data_, nbytes ? nbytes : 1, cu::kMemHostAllocPortable),
           "cuMemHostAlloc");
}

HostBuffer::~HostBuffer() {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuMemFreeHost(data_);
}

void register_host_buffer(py::module_& m) {
  py::class_<HostBuffer, std::shared_ptr<HostBuffer>>(
      m, "HostBuffer", py::buffer_protocol(),
      "Page-locked host memory (bytes). Copies to/from it are truly async: keep it "
      "alive until the stream has passed them.")
      .def(py::init<size_t>(), py::arg("nbytes"))
      .def_property_readonly(
          "ptr", [](const HostBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def_property_readonly("nbytes", &HostBuffer::size)
      .def("__len__", &HostBuffer::size)
      .def_buffer([](HostBuffer& b) {
        return py::buffer_info(b.data(), 1, "B", 1, {static_cast<py::ssize_t>(b.size())}, {1});
      });
}

}  // namespace pgk
