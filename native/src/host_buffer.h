// Page-locked host memory exposed through the buffer protocol, so numpy can view it and
// copies to/from it go straight to the DMA engine, truly asynchronously.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>

#include "context.h"

namespace pgk {

class HostBuffer {
 public:
  explicit HostBuffer(size_t nbytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::shared_ptr<Context> ctx_;
  void* data_ = nullptr;
  size_t size_;
};

void register_host_buffer(pybind11::module_& m);

}  // namespace pgk
