// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104): authenticates control-plane peers without OpenSSL.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepen::control {

using Digest = std::array<uint8_t, 32>;

// Streaming SHA-256: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> data);
  void update(std::string_view text);
  Digest finish();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest sha256(std::span<const uint8_t> data);
Digest sha256(std::string_view text);

// HMAC-SHA256 of the concatenation of `parts` (so callers need not build one buffer).
Digest hmac_sha256(std::span<const uint8_t> key, std::initializer_list<std::span<const uint8_t>> parts);

// Equality in time independent of where the first difference is: a MAC check must not tell an
// attacker how many leading bytes of a forged MAC were right.
bool digest_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);

// Lower-case hex, and its inverse (nullopt on odd length or a non-hex character).
std::string to_hex(std::span<const uint8_t> bytes);
std::optional<std::vector<uint8_t>> from_hex(std::string_view text);

}  // namespace deepen::control
