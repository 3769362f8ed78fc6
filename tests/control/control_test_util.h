// Test helpers for the control plane and the Slurm scripts: bounded waiting, child processes, a strict Prometheus parser.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>  // environ (g++ defines _GNU_SOURCE)

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <system_error>
#include <string>
#include <thread>
#include <vector>

namespace deepen::test {

// Polls `pred` every 5 ms until it holds or `timeout_s` passes; returns whether it held.
inline bool eventually(const std::function<bool()>& pred, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses Prometheus text exposition format 0.0.4 strictly: metric and label name grammar, label
// value escapes, float values, at most one HELP and TYPE per family and TYPE before its samples,
// a family's samples contiguous, no repeated series. Returns "" and fills `out`, or the first error.
inline std::string parse_prometheus(const std::string& text, std::vector<PromSample>& out) {
  auto is_name = [](const std::string& s, bool colon) {
    if (s.empty()) return false;
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
      if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
    }
    return true;
  };
  if (!text.empty() && text.back() != '\n') return "text does not end with a newline";
  std::set<std::string> typed, helped, finished, series;
  std::string current;  // family whose samples are being read
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string where = "line " + std::to_string(n) + " \"" + line + "\": ";
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream words(line.substr(1));
      std::string kind, name;
      words >> kind >> name;
      if (kind != "HELP" && kind != "TYPE") continue;  // plain comment
      if (!is_name(name, true)) return where + "bad metric name in " + kind;
      if (kind == "HELP") {
        if (!helped.insert(name).second) return where + "second HELP";
        const std::string help = line.substr(std::min(line.size(), 7 + name.size() + 1));
        for (size_t i = 0; i < help.size(); ++i) {
          if (help[i] == '\\' && (i + 1 >= help.size() || (help[i + 1] != '\\' && help[i + 1] != 'n'))) {
            return where + "bad escape in HELP";
          }
          if (help[i] == '\\') ++i;
        }
      } else {
        std::string type;
        words >> type;
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary", "untyped"};
        if (!kTypes.count(type)) return where + "unknown TYPE";
        if (!typed.insert(name).second) return where + "second TYPE";
        if (finished.count(name) || current == name) return where + "TYPE after samples";
      }
      continue;
    }
    PromSample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (!is_name(s.name, true)) return where + "bad metric name";
    std::string canonical_labels;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        if (i < line.size() && line[i] == '}') { ++i; break; }
        size_t j = i;
        while (j < line.size() && line[j] != '=') ++j;
        const std::string key = line.substr(i, j - i);
        if (!is_name(key, false) || j + 1 >= line.size() || line[j + 1] != '"') return where + "bad label";
        std::string value;
        size_t k = j + 2;
        for (;; ++k) {
          if (k >= line.size()) return where + "unterminated label value";
          if (line[k] == '"') break;
          if (line[k] == '\\') {
            if (k + 1 >= line.size()) return where + "dangling backslash";
            const char e = line[++k];
            if (e == 'n') value += '\n';
            else if (e == '\\' || e == '"') value += e;
            else return where + "bad escape in label value";
          } else {
            value += line[k];
          }
        }
        if (!s.labels.emplace(key, value).second) return where + "repeated label";
        i = k + 1;
        if (i < line.size() && line[i] == ',') ++i;
        else if (i < line.size() && line[i] == '}') { ++i; break; }
        else return where + "expected ',' or '}' after a label";
      }
    }
    for (const auto& [k, v] : s.labels) canonical_labels += k + "=" + v + "\x1f";
    if (i >= line.size() || line[i] != ' ') return where + "expected a space before the value";
    const std::string rest = line.substr(i + 1);
    const std::string value_text = rest.substr(0, rest.find(' '));
    // NaN and infinities in any case, as Go's ParseFloat (Prometheus' own reader) takes them:
    // prometheus-cpp writes "Nan".
    std::string lower;
    for (char c : value_text) lower += char(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "nan") s.value = std::nan("");
    else if (lower == "+inf" || lower == "inf") s.value = INFINITY;
    else if (lower == "-inf") s.value = -INFINITY;
    else {
      char* end = nullptr;
      s.value = std::strtod(value_text.c_str(), &end);
      if (value_text.empty() || *end != '\0') return where + "bad value";
    }
    if (s.name != current) {
      if (finished.count(s.name)) return where + "samples of a family are not contiguous";
      if (!current.empty()) finished.insert(current);
      current = s.name;
    }
    if (!series.insert(s.name + "\x1e" + canonical_labels).second) return where + "repeated series";
    out.push_back(std::move(s));
  }
  return "";
}

// The value of `name` with label rank=`rank`, or NaN when absent.
inline double prom_value(const std::vector<PromSample>& samples, const std::string& name,
                         const std::string& rank = "") {
  for (const auto& s : samples) {
    if (s.name != name) continue;
    const auto it = s.labels.find("rank");
    if (rank.empty() ? it == s.labels.end() : (it != s.labels.end() && it->second == rank)) return s.value;
  }
  return std::nan("");
}

// A child process with `argv`, this process's environment plus `vars` (an empty value unsets), and
// stdout/stderr in files; killed (SIGKILL) and reaped on destruction if still running.
class TestProcess {
 public:
  TestProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& vars,
              const std::string& tag) {
    dir_ = std::filesystem::temp_directory_path() / ("deepen_test_" + std::to_string(::getpid()) + "_" + tag);
    std::filesystem::create_directories(dir_);
    out_ = (dir_ / "stdout").string();
    err_ = (dir_ / "stderr").string();
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (!vars.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    for (const auto& [k, v] : vars) {
      if (!v.empty()) env.push_back(k + "=" + v);
    }
    std::vector<char*> envp, args;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawnp(&pid_, args[0], &fa, nullptr, args.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  // Also removes the folder with its stdout and stderr: read them before.
  ~TestProcess() {
    if (pid_ > 0 && !exit_code_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ignore;
    std::filesystem::remove_all(dir_, ignore);
  }
  TestProcess(const TestProcess&) = delete;
  TestProcess& operator=(const TestProcess&) = delete;
  pid_t pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }
  // Exit code (128 + signal when killed by one), or nullopt if still running after timeout_s.
  std::optional<int> wait_exit(double timeout_s) {
    eventually([&] {
      if (exit_code_) return true;
      int status = 0;
      if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      return exit_code_.has_value();
    }, timeout_s);
    return exit_code_;
  }
  std::string out() const { return slurp(out_); }
  std::string err() const { return slurp(err_); }
  static std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  pid_t pid_ = -1;
  std::filesystem::path dir_;
  std::string out_, err_;
  std::optional<int> exit_code_;
};

}  // namespace deepen::test
