// Child processes: fork/exec with signal forwarding, so a stop request reaches every rank of a run.
#include "child_process/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <thread>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace deepen {
namespace {

// The one piece of process-wide state: a signal handler can only reach a static. It holds the
// process group of the child now running (0: none), so SIGTERM from Slurm or Ctrl-C from a terminal
// is passed on to the run, which checkpoints and exits with the requeue code.
volatile sig_atomic_t g_child_group = 0;

void forward_signal(int sig) {
  const pid_t group = g_child_group;
  if (group > 0) ::kill(-group, sig);
}

// Installs forwarding for the child's lifetime and restores the previous handlers afterwards.
class SignalForwarding {
 public:
  explicit SignalForwarding(pid_t group) {
    g_child_group = group;
    struct sigaction sa {};
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &previous_[i]);
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
    g_child_group = 0;
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGUSR1};
  std::array<struct sigaction, 3> previous_{};
};

bool needs_quotes(const std::string& w) {
  if (w.empty()) return true;
  for (char c : w) {
    const bool safe = std::isalnum(static_cast<unsigned char>(c)) || std::strchr("@%+=:,./-_", c);
    if (!safe) return true;
  }
  return false;
}

}  // namespace

std::string shell_quote(const std::string& word) {
  if (!needs_quotes(word)) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + shell_quote(a);
  return out;
}

std::string self_executable() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot resolve /proc/self/exe: " + ec.message());
  return p.string();
}

std::string find_in_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t begin = 0;
  while (begin <= dirs.size()) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(begin, end - begin);
    if (!dir.empty()) {
      const std::string candidate = dir + "/" + program;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    begin = end + 1;
  }
  return "";
}

int run_process(const ProcessSpec& spec, const std::function<void()>& poll, double poll_s) {
  if (spec.argv.empty()) throw std::runtime_error("run_process: empty command line");
  int log_fd = -1;
  if (!spec.log_path.empty()) {
    log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) throw std::runtime_error(spec.log_path + ": cannot open log: " + std::strerror(errno));
  }
  // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& [k, v] : spec.env) replaced |= entry.rfind(k + "=", 0) == 0;
    if (!replaced) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string program = find_in_path(spec.argv[0]);
  if (program.empty()) {
    if (log_fd >= 0) ::close(log_fd);
    throw std::runtime_error("cannot find program \"" + spec.argv[0] + "\" in PATH");
  }

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);  // own group: forwarded signals reach mpirun and everything it started
    if (log_fd >= 0) {
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
    }
    ::execve(program.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so the group exists before any signal is forwarded
  if (log_fd >= 0) ::close(log_fd);
  SignalForwarding forwarding(pid);
  int status = 0;
  const auto nap = std::chrono::milliseconds(20);
  auto next_poll = std::chrono::steady_clock::now();
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, poll ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("waitpid failed: ") + std::strerror(errno));
    }
    if (std::chrono::steady_clock::now() >= next_poll) {
      poll();
      next_poll = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(poll_s * 1000));
    }
    std::this_thread::sleep_for(nap);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace deepen
