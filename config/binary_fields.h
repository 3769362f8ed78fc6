// The fixed-width little-endian fields of the binary files deepen writes (token shards, teacher cache
// files), the payload hash both chain over 1 MiB blocks, and writing their bytes whole.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "config/hash.h"

namespace deepen {

inline void put32(unsigned char* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline void put64(unsigned char* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline uint32_t get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

// A payload hash chains fixed blocks of kHashBlockBytes, block `index` seeding its own hash, so the
// hash is the same however the writer was fed (whole buffers or byte by byte).
inline constexpr size_t kHashBlockBytes = size_t(1) << 20;
inline uint64_t chain_block(uint64_t h, const unsigned char* p, size_t n, uint64_t index) {
  return mix64(h ^ hash64(p, n, index));
}

// Writes all n bytes to fd (retrying short writes and EINTR); std::runtime_error naming `path`.
inline void write_all(int fd, const unsigned char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

}  // namespace deepen
