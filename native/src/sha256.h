// SHA-256 (FIPS 180-4) for kernel cache keys and entry checksums.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace pgk {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  // Hashes the length first, so a sequence of fields has exactly one encoding.
  void update_field(const std::string& s);
  std::array<uint8_t, 32> digest();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::array<uint8_t, 32> sha256(const void* data, size_t len);
std::string to_hex(const uint8_t* data, size_t len);

}  // namespace pgk
