// Streams and events. Both keep their context alive, so destruction order never matters.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <utility>

#include "context.h"
#include "cuda_api.h"

namespace pgk {

class Graph;

class Stream {
 public:
  Stream(int priority, bool non_blocking);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream handle() const { return stream_; }
  int priority() const { return priority_; }
  void synchronize() const;
  bool query() const;
  void begin_capture(int mode) const;
  std::shared_ptr<Graph> end_capture() const;
  bool is_capturing() const;

  // (least, greatest); greater priority is the numerically smaller value.
  static std::pair<int, int> priority_range();

 private:
  std::shared_ptr<Context> ctx_;
  CUstream stream_ = nullptr;
  int priority_ = 0;
};

class Event {
 public:
  // blocking: a synchronize() sleeps until the GPU signals (CU_EVENT_BLOCKING_SYNC) instead
  // of spinning a core, as the primary context's automatic policy does with few contexts.
  explicit Event(bool timing, bool blocking = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent handle() const { return event_; }
  void record(CUstream stream) const;
  void synchronize() const;
  bool query() const;
  float elapsed_time(const Event& end) const;

 private:
  std::shared_ptr<Context> ctx_;
  CUevent event_ = nullptr;
  bool timing_;
};

// None -> the legacy default stream, a Stream -> its handle, an int -> a raw CUstream from
// another library (torch, cupy). Anything else raises TypeError.
CUstream stream_handle(pybind11::handle obj);

// True when `stream` is capturing into a graph: copies from pageable host memory must not be
// captured (a replay would read or write memory the caller no longer owns).
bool stream_is_capturing(CUstream stream);

void register_streams(pybind11::module_& m);

}  // namespace pgk
