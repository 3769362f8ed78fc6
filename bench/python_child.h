// Bench support: a Python baseline as a child process answering one JSON line per request line,
// so a C++ bench can alternate its own steps with the baseline's under the same machine load.
#pragma once

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepen::bench {

// The Python baseline as a child answering one JSON line per request line.
class PythonChild {
 public:
  // `stderr_path`: where the child's stderr goes (a log a bench shows when the child fails).
  PythonChild(const std::vector<std::string>& argv, const std::vector<std::string>& env,
              const std::string& stderr_path = "/dev/null") {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      // A bench killed mid-run must not leave its baselines computing (and holding gigabytes) behind it.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(err, 2);
      for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1], err}) close(fd);
      for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
  }
  ~PythonChild() {
    if (in_) { std::fputs("quit\n", in_); std::fclose(in_); }
    if (out_) std::fclose(out_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  nlohmann::json read() {
    std::string line;
    for (int c; (c = std::fgetc(out_)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
    if (line.empty()) throw std::runtime_error("python baseline ended without an answer");
    return nlohmann::json::parse(line);
  }
  nlohmann::json request(const char* what) {
    std::fprintf(in_, "%s\n", what);
    std::fflush(in_);
    return read();
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

}  // namespace deepen::bench
