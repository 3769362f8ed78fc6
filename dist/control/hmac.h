// HMAC-SHA256 and its constant-time check, from OpenSSL: how control-plane peers prove the job secret.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>

struct evp_mac_ctx_st;

namespace deepen::control {

using Digest = std::array<uint8_t, 32>;

// HMAC-SHA256 (RFC 2104) of the concatenation of `parts`, so callers need not build one buffer.
// OpenSSL's EVP_MAC does the work; throws std::runtime_error with OpenSSL's reason if it cannot
// (no provider offers HMAC or SHA-256, e.g. a FIPS configuration without them), and
// std::invalid_argument for an empty key (the job secret never is).
Digest hmac_sha256(std::span<const uint8_t> key, std::initializer_list<std::span<const uint8_t>> parts);

// Equality in time independent of where the first difference is (CRYPTO_memcmp): a MAC check must
// not tell an attacker how many leading bytes of a forged MAC were right. Sizes are not secret.
bool digest_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);

// HMAC-SHA256 under one key for many messages (every control frame after the handshake): the key's
// inner and outer pads are computed once, and each message starts from a copy of that state, so a
// frame costs the two SHA-256 passes over its bytes and no provider look-up. Throws as hmac_sha256.
class HmacKey {
 public:
  explicit HmacKey(std::span<const uint8_t> key);
  ~HmacKey();
  HmacKey(HmacKey&&) noexcept;
  HmacKey& operator=(HmacKey&&) noexcept;
  Digest operator()(std::initializer_list<std::span<const uint8_t>> parts) const;

 private:
  struct CtxFree {
    void operator()(evp_mac_ctx_st* c) const;
  };
  std::unique_ptr<evp_mac_ctx_st, CtxFree> ctx_;
};

}  // namespace deepen::control
