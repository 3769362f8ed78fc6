// Test helpers: tiny transformers-made Qwen3 fixtures (generated on first use into the build
// folder), shell commands with exit codes, and reading logits files.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "model/safetensors.h"
#include "model/tensor_bridge.h"
#include "tests/test_paths.h"

namespace deepen::test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string hf_reference_script(const std::string& name) {
  return std::string(kSourceDir) + "/tests/hf_reference/" + name;
}

// Folder with the fixtures of tests/hf_reference/make_tiny_qwen3.py. The folder name carries a
// hash of the script, so an edited script regenerates them; the script renames a finished
// temporary folder into place, so test processes running in parallel never read a partial one.
inline std::string tiny_qwen3_fixtures() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    const std::string script = hf_reference_script("make_tiny_qwen3.py");
    std::ifstream in(script);
    std::stringstream text;
    text << in.rdbuf() << std::ifstream(hf_reference_script("run_transformers.py")).rdbuf();
    uint64_t h = 0xcbf29ce484222325ULL;
    for (unsigned char c : text.str()) h = (h ^ c) * 0x100000001b3ULL;
    std::ostringstream name;
    name << kBinaryDir << "/hf_fixtures/tiny_qwen3_" << std::hex << h;
    dir = name.str();
    std::filesystem::create_directories(std::filesystem::path(dir).parent_path());
    // One generator at a time across the test processes ctest runs in parallel; the others wait.
    const int lock = ::open((dir + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
    if (lock >= 0) ::flock(lock, LOCK_EX);
    if (!std::filesystem::exists(dir)) {
      const CommandResult r = run_command(std::string(kPython) + " " + script + " --out " + dir);
      if (r.exit_code != 0 || !std::filesystem::exists(dir))
        throw std::runtime_error("make_tiny_qwen3.py failed:\n" + r.output);
    }
    if (lock >= 0) ::close(lock);  // releases the flock
  });
  return dir;
}

inline const std::vector<std::string>& tiny_qwen3_cases() {
  static const std::vector<std::string> cases = {"tied_gqa", "untied_mha", "untied_gqa_sharded", "bias_gqa4"};
  return cases;
}

// "logits.<i>" tensors of a file written by `deepen forward` or run_transformers.py, in order.
inline std::vector<at::Tensor> read_logits(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<at::Tensor> out;
  for (size_t i = 0;; ++i) {
    const TensorInfo* info = file.find("logits." + std::to_string(i));
    if (info == nullptr) break;
    out.push_back(file_tensor(file, *info).clone());
  }
  return out;
}

// Token ids of a fixture's ids.txt, one int64 [1, T] tensor per line.
inline std::vector<at::Tensor> read_ids(const std::string& path) {
  std::ifstream in(path);
  std::vector<at::Tensor> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<int64_t> ids;
    int64_t id;
    while (words >> id) ids.push_back(id);
    if (!ids.empty()) out.push_back(at::tensor(at::ArrayRef<int64_t>(ids), at::kLong).unsqueeze(0));
  }
  return out;
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

// A fresh, empty temporary folder for one test.
inline std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::path(kBinaryDir) / "test_tmp" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace deepen::test
