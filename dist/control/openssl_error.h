// The exception for an OpenSSL call that just failed, carrying OpenSSL's own reason.
#pragma once

#include <openssl/err.h>

#include <stdexcept>
#include <string>

namespace deepen::control {

// "<what>: <OpenSSL's reason>". Empties this thread's OpenSSL error queue, so that a later failure
// is not reported with this one's reason.
inline std::runtime_error openssl_error(const std::string& what) {
  char reason[256] = "no reason given";
  if (const unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, reason, sizeof reason);
  ERR_clear_error();
  return std::runtime_error(what + ": " + reason);
}

}  // namespace deepen::control
