// HMAC-SHA256 through OpenSSL 3's EVP_MAC (the HMAC_CTX calls are deprecated there) and CRYPTO_memcmp.
#include "dist/control/hmac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "dist/control/openssl_error.h"

namespace deepen::control {
namespace {

[[noreturn]] void fail(const char* call) {
  throw openssl_error(std::string("HMAC-SHA256: OpenSSL ") + call + " failed");
}

struct MacFree {
  void operator()(EVP_MAC* m) const { EVP_MAC_free(m); }
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

}  // namespace

Digest hmac_sha256(std::span<const uint8_t> key, std::initializer_list<std::span<const uint8_t>> parts) {
  // EVP_MAC_init takes a null key as "keep the previous key", of which a fresh context has none.
  if (key.empty()) throw std::invalid_argument("HMAC-SHA256: empty key");
  // Fetched per call: a handshake is rare, and a cached EVP_MAC would be process-wide state.
  const std::unique_ptr<EVP_MAC, MacFree> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (!mac) fail("EVP_MAC_fetch(HMAC)");
  const std::unique_ptr<EVP_MAC_CTX, MacFree> ctx(EVP_MAC_CTX_new(mac.get()));
  if (!ctx) fail("EVP_MAC_CTX_new");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx.get(), key.data(), key.size(), params) != 1) fail("EVP_MAC_init");
  for (const auto& part : parts) {
    if (EVP_MAC_update(ctx.get(), part.data(), part.size()) != 1) fail("EVP_MAC_update");
  }
  Digest out{};
  size_t written = 0;
  if (EVP_MAC_final(ctx.get(), out.data(), &written, out.size()) != 1) fail("EVP_MAC_final");
  if (written != out.size()) {
    throw std::runtime_error("HMAC-SHA256: OpenSSL gave a " + std::to_string(written) + "-byte digest, expected 32");
  }
  return out;
}

void HmacKey::CtxFree::operator()(evp_mac_ctx_st* c) const { EVP_MAC_CTX_free(c); }

HmacKey::HmacKey(std::span<const uint8_t> key) {
  if (key.empty()) throw std::invalid_argument("HMAC-SHA256: empty key");
  const std::unique_ptr<EVP_MAC, MacFree> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (!mac) fail("EVP_MAC_fetch(HMAC)");
  ctx_.reset(EVP_MAC_CTX_new(mac.get()));
  if (!ctx_) fail("EVP_MAC_CTX_new");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx_.get(), key.data(), key.size(), params) != 1) fail("EVP_MAC_init");
}

HmacKey::~HmacKey() = default;
HmacKey::HmacKey(HmacKey&&) noexcept = default;
HmacKey& HmacKey::operator=(HmacKey&&) noexcept = default;

Digest HmacKey::operator()(std::initializer_list<std::span<const uint8_t>> parts) const {
  const std::unique_ptr<EVP_MAC_CTX, MacFree> ctx(EVP_MAC_CTX_dup(ctx_.get()));
  if (!ctx) fail("EVP_MAC_CTX_dup");
  for (const auto& part : parts) {
    if (EVP_MAC_update(ctx.get(), part.data(), part.size()) != 1) fail("EVP_MAC_update");
  }
  Digest out{};
  size_t written = 0;
  if (EVP_MAC_final(ctx.get(), out.data(), &written, out.size()) != 1 || written != out.size()) fail("EVP_MAC_final");
  return out;
}

bool digest_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace deepen::control
