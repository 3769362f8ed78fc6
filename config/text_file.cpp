// Reading and atomically replacing a whole file (see text_file.h).
#include "config/text_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "config/input_error.h"

namespace deepen {

std::string read_file_text(const std::string& path, const std::string& what) {
  const std::string role = what.empty() ? "" : " " + what;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open" + role + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(path + ": cannot read" + role + ": " + std::strerror(errno));
  return text.str();
}

void write_file_text(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](int fd, const char* doing) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": cannot " + doing + " " + what + ": " + reason);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(fd, "write");
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(fd, "write");
    done += static_cast<size_t>(n);
  }
  // Some file systems (NFS, Lustre) report a full disk or quota only when the data leaves the cache.
  if (::close(fd) != 0) fail(-1, "write");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(-1, "replace");
}

}  // namespace deepen
