// Per-job secret: generation (OpenSSL's RAND_bytes), hex form, and the mode-0600 file that carries it.
#include "dist/control/secret.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "config/input_error.h"
#include "dist/control/hex.h"
#include "dist/control/openssl_error.h"

namespace deepen::control {

Secret generate_secret() {
  Secret s;
  // RAND_bytes fails rather than return bytes from an unseeded generator.
  if (RAND_bytes(s.data(), int(s.size())) != 1) throw openssl_error("job secret: OpenSSL RAND_bytes failed");
  return s;
}

std::string secret_hex(const Secret& secret) { return to_hex(secret); }

Secret parse_secret_hex(std::string_view text, const std::string& origin) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  const auto bytes = from_hex(text);
  if (!bytes || bytes->size() != Secret{}.size()) {
    throw InputError(origin + ": job secret must be 64 hex characters (32 bytes), got " +
                     std::to_string(text.size()) + " characters" + (bytes ? "" : " (not all hex)"));
  }
  Secret s;
  std::copy(bytes->begin(), bytes->end(), s.begin());
  return s;
}

void write_secret_file(const std::string& path, const Secret& secret) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw InputError(tmp + ": cannot create the job secret file: " + std::strerror(errno));
  // The umask can only remove bits; fchmod makes sure no one but the owner has any.
  const std::string text = secret_hex(secret) + "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 &&
                  ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    throw InputError(path + ": cannot write the job secret file: " + std::strerror(e));
  }
}

Secret read_secret_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    throw InputError(path + ": cannot read the job secret file: " + std::strerror(errno));
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    throw InputError(path + ": job secret file has mode " + mode +
                     "; it must not be readable by group or others (chmod 600)");
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw InputError(path + ": cannot read the job secret file");
  return parse_secret_hex(text.str(), path);
}

std::optional<Secret> secret_from_env() {
  if (const char* hex = std::getenv("DEEPEN_JOB_SECRET"); hex && *hex) {
    return parse_secret_hex(hex, "DEEPEN_JOB_SECRET");
  }
  if (const char* file = std::getenv("DEEPEN_JOB_SECRET_FILE"); file && *file) {
    return read_secret_file(file);
  }
  return std::nullopt;
}

}  // namespace deepen::control
