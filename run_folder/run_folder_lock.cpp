// The run folder's lock: flock(2) on <run dir>/.lock, its holder written into it.
#include "run_folder/run_folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "config/input_error.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

std::string lock_path(const std::string& run_dir) { return RunFolder(run_dir).lock_file(); }

std::string this_holder() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char since[64];
  std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const char* job = std::getenv("SLURM_JOB_ID");
  std::ostringstream out;
  out << "host " << host << ", pid " << ::getpid() << (job && *job ? std::string(", Slurm job ") + job : "")
      << ", since " << since;
  return out.str();
}

}  // namespace

std::string RunFolderLock::holder(const std::string& run_dir) {
  std::ifstream in(lock_path(run_dir));
  std::string line;
  std::getline(in, line);
  return line;
}

RunFolderLock::RunFolderLock(const std::string& run_dir, double wait_s) {
  fs::create_directories(run_dir);
  const std::string path = lock_path(run_dir);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open the run folder's lock: " + std::strerror(errno));
  const auto start = std::chrono::steady_clock::now();
  auto said = start;
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
      std::cerr << "deepen: WARNING: " << path << ": the file system offers no locks (" << std::strerror(err)
                << "); nothing keeps a second job from writing " << run_dir << " (docs/cluster.md)\n";
      return;
    }
    if (err != EWOULDBLOCK) {
      const std::string why = std::strerror(err);
      ::close(fd_);
      fd_ = -1;
      throw std::runtime_error(path + ": cannot lock the run folder: " + why);
    }
    waited_ = true;
    const auto now = std::chrono::steady_clock::now();
    const double waited = std::chrono::duration<double>(now - start).count();
    if (waited >= wait_s) {
      ::close(fd_);
      fd_ = -1;
      std::ostringstream msg;
      msg << run_dir << ": another job writes this run folder (" << holder(run_dir) << "); it still held " << path
          << " after " << static_cast<int>(waited) << " s. One job per run folder: wait for it to end, or give this "
          << "run another run.out_dir";
      throw InputError(msg.str());
    }
    if (now - said >= std::chrono::seconds(10) || now == start) {
      std::cerr << "deepen: " << run_dir << " is locked by another job (" << holder(run_dir) << "); waiting up to "
                << static_cast<int>(wait_s) << " s for it to end\n";
      said = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string me = this_holder() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    std::cerr << "deepen: WARNING: " << path << ": cannot write who holds the lock: " << std::strerror(errno) << "\n";
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace deepen
