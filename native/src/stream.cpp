#include "stream.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <string>

#include "driver.h"
#include "errors.h"
#include "graph.h"

namespace py = pybind11;

namespace pgk {

Stream::Stream(int priority, bool non_blocking) : ctx_(current_context()) {
  auto [least, greatest] = priority_range();
  // The driver clamps silently; clamping here keeps .priority truthful.
  priority_ = std::min(least, std::max(greatest, priority));
  unsigned flags = non_blocking ? cu::kStreamNonBlocking : 0;
  check_cu(driver().cuStreamCreateWithPriority(&stream_, flags, priority_),
           "cuStreamCreateWithPriority");
}

Stream::~Stream() {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuStreamDestroy(stream_);
}

void Stream::synchronize() const {
  check_cu(driver().cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

bool Stream::query() const {
  CUresult r = driver().cuStreamQuery(stream_);
  if (r == cu::kErrorNotReady) return false;
  check_cu(r, "cuStreamQuery");
  return true;
}

void Stream::begin_capture(int mode) const {
  ctx_->make_current();
  check_cu(driver().cuStreamBeginCapture(stream_, mode), "cuStreamBeginCapture");
}

std::shared_ptr<Graph> Stream::end_capture() const {
  CUgraph graph = nullptr;
  CUresult r = driver().cuStreamEndCapture(stream_, &graph);
  if (r != cu::kSuccess) {
    if (graph) driver().cuGraphDestroy(graph);
    check(r, "cuStreamEndCapture");
  }
  return std::make_shared<Graph>(ctx_, graph);
}

bool Stream::is_capturing() const { return stream_is_capturing(stream_); }

std::pair<int, int> Stream::priority_range() {
  current_context();
  int least = 0, greatest = 0;
  check_cu(driver().cuCtxGetStreamPriorityRange(&least, &greatest), "cuCtxGetStreamPriorityRange");
  return {least, greatest};
}

Event::Event(bool timing, bool blocking) : ctx_(current_context()), timing_(timing) {
  unsigned flags = timing ? cu::kEventDefault : cu::kEventDisableTiming;
  if (blocking) flags |= cu::kEventBlockingSync;
  check_cu(driver().cuEventCreate(&event_, flags), "cuEventCreate");
}

Event::~Event() {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuEventDestroy(event_);
}

void Event::record(CUstream stream) const {
  // A thread that has made no other CUDA call yet (a serving engine's thread) has no current
  // context, and the legacy default stream is the current context's.
  ctx_->make_current();
  check_cu(driver().cuEventRecord(event_, stream), "cuEventRecord");
}

void Event::synchronize() const {
  check_cu(driver().cuEventSynchronize(event_), "cuEventSynchronize");
}

bool Event::query() const {
  CUresult r = driver().cuEventQuery(event_);
  if (r == cu::kErrorNotReady) return false;
  check_cu(r, "cuEventQuery");
  return true;
}

float Event::elapsed_time(const Event& end) const {
  if (!timing_ || !end.timing_) {
    throw CudaError("cuEventElapsedTime", cu::kErrorInvalidValue,
                    "elapsed_time needs two events created with timing=True");
  }
  float ms = 0.0f;
  check_cu(driver().cuEventElapsedTime(&ms, event_, end.event_), "cuEventElapsedTime");
  return ms;
}

CUstream stream_handle(py::handle obj) {
  if (obj.is_none()) return nullptr;
  if (py::isinstance<Stream>(obj)) return obj.cast<const Stream&>().handle();
  if (PyLong_Check(obj.ptr())) {
    unsigned long long v = PyLong_AsUnsignedLongLong(obj.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw py::type_error("stream handle must be a non-negative int");
    }
    return reinterpret_cast<CUstream>(static_cast<uintptr_t>(v));
  }
  throw py::type_error("stream must be a Stream, an int handle or None, got " +
                       std::string(py::str(py::type::of(obj).attr("__name__"))));
}

bool stream_is_capturing(CUstream stream) {
  int status = cu::kCaptureStatusNone;
  check_cu(driver().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  return status != cu::kCaptureStatusNone;
}

namespace {

int capture_mode(const std::string& mode) {
  if (mode == "global") return cu::kCaptureModeGlobal;
  if (mode == "thread_local") return cu::kCaptureModeThreadLocal;
  if (mode == "relaxed") return cu::kCaptureModeRelaxed;
  throw py::value_error("capture mode must be 'global', 'thread_local' or 'relaxed', got '" + mode +
                        "'");
}

}  // namespace

void register_streams(py::module_& m) {
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<Stream, std::shared_ptr<Stream>>(m, "Stream", "A CUDA stream owned by this object.")
      .def(py::init<int, bool>(), py::arg("priority") = 0, py::arg("non_blocking") = true)
      .def_property_readonly(
          "handle", [](const Stream& s) { return reinterpret_cast<uintptr_t>(s.handle()); })
      .def_property_readonly("priority", &Stream::priority)
      .def("synchronize", &Stream::synchronize, release())
      .def("query", &Stream::query, "True when all work on the stream has finished.")
      .def(
          "begin_capture",
          [](const Stream& s, const std::string& mode) { s.begin_capture(capture_mode(mode)); },
          py::arg("mode") = "thread_local")
      .def("end_capture", &Stream::end_capture)
      .def("is_capturing", &Stream::is_capturing)
      .def_static("priority_range", &Stream::priority_range,
                  "(least, greatest) priority; greatest is numerically smallest.")
      .def("__int__", [](const Stream& s) { return reinterpret_cast<uintptr_t>(s.handle()); });

  py::class_<Event, std::shared_ptr<Event>>(m, "Event", "A CUDA event owned by this object.")
      .def(py::init<bool, bool>(), py::arg("timing") = true, py::arg("blocking") = false)
      .def_property_readonly("handle",
                             [](const Event& e) { return reinterpret_cast<uintptr_t>(e.handle()); })
      .def(
          "record", [](const Event& e, py::handle stream) { e.record(stream_handle(stream)); },
          py::arg("stream") = py::none())
      .def("synchronize", &Event::synchronize, release())
      .def("query", &Event::query, "True when the recorded work has finished.")
      .def("elapsed_time", &Event::elapsed_time, py::arg("end"),
           "Milliseconds from this event to `end`; both must have been recorded.");

  m.def(
      "synchronize",
      []() {
        current_context();
        py::gil_scoped_release nogil;
        check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize");
      },
      "Wait for all work on the current device.");
}

}  // namespace pgk
