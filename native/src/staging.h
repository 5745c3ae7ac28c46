// Pinned staging buffers for copies from/to pageable host memory, reused across copies and
// cycled in chunks so a large copy overlaps the host memcpy with the DMA of the last chunk.
// Consecutive copies take the next buffer, not the first: a reused buffer waits for its
// last copy, and a decode loop's small uploads (a position, a noise index) queued behind a
// running graph must not wait for that graph. Small uploads take slots of their own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_api.h"

namespace pgk {

struct StagingStats {
  uint64_t copies = 0;
  uint64_t chunks = 0;
  uint64_t bytes = 0;
  uint64_t buffers = 0;
};

class StagingPool {
 public:
  static constexpr size_t kChunkBytes = size_t{4} << 20;
  static constexpr size_t kBuffers = 4;
  static constexpr size_t kSlotBytes = 4096;  // uploads up to this size take one slot
  static constexpr size_t kSlots = 64;

  StagingPool() = default;
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Returns once `src` has been consumed; the DMA may still be in flight on `stream`, which
  // is fine because it reads the staging buffer, not `src`.
  void htod(CUdeviceptr dst, const void* src, size_t nbytes, CUstream stream);
  // Returns once `dst` holds the data: pageable memory can only be filled after the device
  // work before it on `stream` is done.
  void dtoh(void* dst, CUdeviceptr src, size_t nbytes, CUstream stream);

 private:
  struct Buffer {
    void* host = nullptr;
    CUevent done = nullptr;
    bool pending = false;
    Buffer();
    ~Buffer();
    void wait();
  };
  Buffer& buffer(size_t i);
  Buffer& next_buffer();

  std::mutex mu_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  size_t next_ = 0;
  // One pinned block cut into kSlots slots, each with its event, used in turn.
  struct Slots {
    void* host = nullptr;
    CUevent done[kSlots] = {};
    bool pending[kSlots] = {};
    Slots();
    ~Slots();
  };
  std::unique_ptr<Slots> slots_;
  size_t next_slot_ = 0;
};

StagingStats staging_stats();

}  // namespace pgk
