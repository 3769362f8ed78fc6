// Checked appends with the partial record taken back on failure (see append_file.h).
#include "run_folder/append_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace deepen {

AppendFile::AppendFile(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path_ + ": cannot open for writing " + what_ + ": " + std::strerror(errno));
}

AppendFile::AppendFile(AppendFile&& other) noexcept
    : path_(std::move(other.path_)), what_(std::move(other.what_)), fd_(other.fd_), failure_(std::move(other.failure_)) {
  other.fd_ = -1;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append(std::string_view bytes) {
  if (!failure_.empty()) throw std::runtime_error(failure_);
  struct stat st {};
  const off_t before = ::fstat(fd_, &st) == 0 ? st.st_size : -1;
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failure_ = path_ + ": cannot append " + what_ + ": " + std::strerror(errno);
      // Shrinking needs no space: the torn record goes, the file ends on the previous whole one.
      if (done > 0 && before >= 0 && ::ftruncate(fd_, before) != 0)
        failure_ += " (and the partial record could not be taken back: " + std::string(std::strerror(errno)) + ")";
      throw std::runtime_error(failure_);
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace deepen
