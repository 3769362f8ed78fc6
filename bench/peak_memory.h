// Bench support: a process's own peak memory and CPU time, and running one variant of a bench in a
// child process (this binary again) so that each variant's peak resident set is its own.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepen::bench {

// A field of /proc/self/status in bytes (VmRSS, VmHWM).
inline int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream fields(line.substr(field.size() + 1));
      int64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  throw std::runtime_error("/proc/self/status has no " + field);
}

inline void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  if (!out) throw std::runtime_error("cannot reset the peak RSS through /proc/self/clear_refs");
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds of this process (all threads): steadier than wall time on a shared machine.
inline double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Runs this binary again with `args`, and `env` (NAME=VALUE) added to its environment (read at its
// start: GLIBC_TUNABLES, for one); returns the JSON after "RESULT ".
inline nlohmann::json run_variant(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string text;
  std::array<char, 4096> buf{};
  ssize_t n = 0;
  while ((n = read(fds[0], buf.data(), buf.size())) > 0) text.append(buf.data(), static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const auto at = text.find("RESULT ");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || at == std::string::npos)
    throw std::runtime_error("variant run failed (status " + std::to_string(status) + "; killed for memory?): " + text);
  return nlohmann::json::parse(text.substr(at + 7));
}

// Runs `mpirun -np <ranks> <self> <args>` and returns each rank's JSON after "RESULT " (one per
// rank expected): a variant on real MPI ranks that start clean.
inline std::vector<nlohmann::json> run_mpi_variant(const std::string& self, int ranks, const std::string& args) {
  const std::string cmd = "mpirun --oversubscribe -np " + std::to_string(ranks) + " " + self + " " + args;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot start: " + cmd);
  std::vector<nlohmann::json> out;
  char line[4096];
  while (fgets(line, sizeof line, pipe)) {
    const std::string s(line);
    const auto at = s.find("RESULT ");
    if (at != std::string::npos) out.push_back(nlohmann::json::parse(s.substr(at + 7)));
  }
  const int status = pclose(pipe);
  if (status != 0 || static_cast<int>(out.size()) != ranks)
    throw std::runtime_error(cmd + ": failed (status " + std::to_string(status) + ", " + std::to_string(out.size()) +
                             " results)");
  return out;
}

// The largest value of `key` over the ranks' results (the worst rank).
inline double max_over_ranks(const std::vector<nlohmann::json>& results, const char* key) {
  double m = -1e300;
  for (const auto& j : results) m = std::max(m, j[key].get<double>());
  return m;
}

}  // namespace deepen::bench
