// Stable 64-bit hashing for data: document split decisions, shard payload checks, token checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace deepen {

// splitmix64's finalizer: a bijective avalanche on 64 bits (also the sampler's round function).
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Hash of a byte string. Values are part of on-disk formats (shard headers) and of decisions that
// must agree between runs and machines (which documents are held out), so the function is fixed:
// words are read little-endian on every platform and the constants never change.
inline uint64_t hash64(const void* data, size_t len, uint64_t seed = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = mix64(seed ^ (0x9e3779b97f4a7c15ULL * (len + 1)));
  auto load = [](const unsigned char* q) {
    uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w |= uint64_t(q[i]) << (8 * i);
    return w;
  };
  size_t i = 0;
  // Four independent lanes so the multiply latency overlaps (several GB/s).
  if (len >= 32) {
    uint64_t a = h, b = h ^ 0x6a09e667f3bcc908ULL, c = h ^ 0xbb67ae8584caa73bULL, d = h ^ 0x3c6ef372fe94f82bULL;
    for (; i + 32 <= len; i += 32) {
      a = (a ^ load(p + i)) * 0x9fb21c651e98df25ULL; a ^= a >> 29;
      b = (b ^ load(p + i + 8)) * 0x9fb21c651e98df25ULL; b ^= b >> 29;
      c = (c ^ load(p + i + 16)) * 0x9fb21c651e98df25ULL; c ^= c >> 29;
      d = (d ^ load(p + i + 24)) * 0x9fb21c651e98df25ULL; d ^= d >> 29;
    }
    h = mix64(a) ^ mix64(b + 1) ^ mix64(c + 2) ^ mix64(d + 3);
  }
  for (; i + 8 <= len; i += 8) h = mix64(h ^ load(p + i));
  uint64_t tail = 0;
  for (size_t k = 0; i + k < len; ++k) tail |= uint64_t(p[i + k]) << (8 * k);
  return mix64(h ^ tail ^ (uint64_t(len) << 56));
}

inline uint64_t hash64(std::string_view s, uint64_t seed = 0) { return hash64(s.data(), s.size(), seed); }

// Checksum of a batch's token ids (host order int32): the student compares the one that arrives
// with the teacher's logits against its own, so a sampler desync fails loudly.
inline uint64_t token_checksum(std::span<const int32_t> ids) {
  return hash64(ids.data(), ids.size_bytes(), 0x746f6b656e73ULL);
}

}  // namespace deepen
