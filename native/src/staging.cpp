#include "staging.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "driver.h"
#include "errors.h"

namespace pgk {
namespace {

std::atomic<uint64_t> g_copies{0}, g_chunks{0}, g_bytes{0}, g_buffers{0};

}  // namespace

StagingPool::Buffer::Buffer() {
  const cu::DriverApi& api = driver();
  // Portable so the buffer serves copies whichever context is current.
  check_cu(api.cuMemHostAlloc(&host, kChunkBytes, cu::kMemHostAllocPortable), "cuMemHostAlloc");
  CUresult r = api.cuEventCreate(&done, cu::kEventDisableTiming);
  if (r != cu::kSuccess) {
    api.cuMemFreeHost(host);
    check(r, "cuEventCreate");
  }
  g_buffers++;
}

StagingPool::Buffer::~Buffer() {
  const cu::DriverApi* api = driver_if_loaded();
  if (!api) return;
  // The DMA may still read the buffer; freeing it under the copy would corrupt data.
  if (pending) api->cuEventSynchronize(done);
  api->cuEventDestroy(done);
  api->cuMemFreeHost(host);
}

void StagingPool::Buffer::wait() {
  if (!pending) return;
  check_cu(driver().cuEventSynchronize(done), "cuEventSynchronize");
  pending = false;
}

StagingPool::Slots::Slots() {
  const cu::DriverApi& api = driver();
  check_cu(api.cuMemHostAlloc(&host, kSlots * kSlotBytes, cu::kMemHostAllocPortable),
           "cuMemHostAlloc");
  for (size_t i = 0; i < kSlots; ++i) {
    CUresult r = api.cuEventCreate(&done[i], cu::kEventDisableTiming);
    if (r != cu::kSuccess) {
      for (size_t j = 0; j < i; ++j) api.cuEventDestroy(done[j]);
      api.cuMemFreeHost(host);
      check(r, "cuEventCreate");
    }
  }
}

StagingPool::Slots::~Slots() {
  const cu::DriverApi* api = driver_if_loaded();
  if (!api) return;
  for (size_t i = 0; i < kSlots; ++i) {
    if (pending[i]) api->cuEventSynchronize(done[i]);  // the DMA may still read the slot
    api->cuEventDestroy(done[i]);
  }
  api->cuMemFreeHost(host);
}

StagingPool::Buffer& StagingPool::buffer(size_t i) {
  while (buffers_.size() <= i) buffers_.push_back(std::make_unique<Buffer>());
  return *buffers_[i];
}

StagingPool::Buffer& StagingPool::next_buffer() {
  Buffer& b = buffer(next_);
  next_ = (next_ + 1) % kBuffers;
  return b;
}

void StagingPool::htod(CUdeviceptr dst, const void* src, size_t nbytes, CUstream stream) {
  const cu::DriverApi& api = driver();
  std::lock_guard<std::mutex> lock(mu_);
  const char* in = static_cast<const char*>(src);
  if (nbytes <= kSlotBytes) {
    if (!slots_) slots_ = std::make_unique<Slots>();
    size_t i = next_slot_;
    next_slot_ = (next_slot_ + 1) % kSlots;
    if (slots_->pending[i]) check_cu(api.cuEventSynchronize(slots_->done[i]), "cuEventSynchronize");
    char* host = static_cast<char*>(slots_->host) + i * kSlotBytes;
    std::memcpy(host, in, nbytes);
    check_cu(api.cuMemcpyHtoDAsync(dst, host, nbytes, stream), "cuMemcpyHtoDAsync");
    check_cu(api.cuEventRecord(slots_->done[i], stream), "cuEventRecord");
    slots_->pending[i] = true;
    g_copies++;
    g_chunks++;
    g_bytes += nbytes;
    return;
  }
  size_t nchunks = (nbytes + kChunkBytes - 1) / kChunkBytes;
  for (size_t k = 0; k < nchunks; ++k) {
    Buffer& b = next_buffer();
    b.wait();
    size_t off = k * kChunkBytes;
    size_t len = std::min(kChunkBytes, nbytes - off);
    std::memcpy(b.host, in + off, len);
    check_cu(api.cuMemcpyHtoDAsync(dst + off, b.host, len, stream), "cuMemcpyHtoDAsync");
    check_cu(api.cuEventRecord(b.done, stream), "cuEventRecord");
    b.pending = true;
  }
  g_copies++;
  g_chunks += nchunks;
  g_bytes += nbytes;
}

void StagingPool::dtoh(void* dst, CUdeviceptr src, size_t nbytes, CUstream stream) {
  const cu::DriverApi& api = driver();
  std::lock_guard<std::mutex> lock(mu_);
  char* out = static_cast<char*>(dst);
  size_t nchunks = (nbytes + kChunkBytes - 1) / kChunkBytes;
  auto issue = [&](size_t k) {
    Buffer& b = buffer(k % kBuffers);
    b.wait();
    size_t off = k * kChunkBytes;
    size_t len = std::min(kChunkBytes, nbytes - off);
    check_cu(api.cuMemcpyDtoHAsync(b.host, src + off, len, stream), "cuMemcpyDtoHAsync");
    check_cu(api.cuEventRecord(b.done, stream), "cuEventRecord");
    b.pending = true;
  };
  for (size_t k = 0; k < std::min(nchunks, kBuffers); ++k) issue(k);
  for (size_t k = 0; k < nchunks; ++k) {
    Buffer& b = buffer(k % kBuffers);
    b.wait();
    size_t off = k * kChunkBytes;
    std::memcpy(out + off, b.host, std::min(kChunkBytes, nbytes - off));
    if (k + kBuffers < nchunks) issue(k + kBuffers);
  }
  g_copies++;
  g_chunks += nchunks;
  g_bytes += nbytes;
}

StagingStats staging_stats() {
  return StagingStats{g_copies.load(), g_chunks.load(), g_bytes.load(), g_buffers.load()};
}

}  // namespace pgk
