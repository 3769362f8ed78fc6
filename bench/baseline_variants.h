// Bench support: the plain-PyTorch baseline variants a bench runs side by side (eager or torch.compile,
// under glibc malloc's defaults, its hugetlb tunable, tcmalloc or jemalloc), and starting one as a child.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/python_child.h"

namespace deepen::bench {

// Why several: a plain PyTorch user can pick any of these without writing code (an environment
// variable, a preloaded library, one torch.compile call), so a bench's ratio that counts is the one
// against the fastest. glibc's default malloc mmaps every tensor over 32 MB afresh and faults it in
// 4 KB pages on each step; GLIBC_TUNABLES=glibc.malloc.hugetlb=1 makes glibc madvise those mappings
// for transparent huge pages (THP is in madvise mode on the machines measured), 2 MB per fault;
// tcmalloc and jemalloc keep freed memory mapped for reuse.
struct BaselineVariant {
  std::string name;              // "eager+hugetlb"
  bool compile = false;          // the child is asked for --compile
  std::vector<std::string> env;  // added to the child's environment
  std::string setting;           // what the name means, printed beside its result
};

// The library file of an LD_PRELOAD'ed malloc, or "" when none of the usual places has it.
inline std::string find_library(const std::string& file) {
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"})
    if (std::filesystem::exists(std::string(dir) + "/" + file)) return std::string(dir) + "/" + file;
  return "";
}

// "eager" | "compile", then "+hugetlb" | "+tcmalloc" | "+jemalloc" or nothing (glibc's defaults).
// Example: "compile+jemalloc" -> compile, LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2.
// Throws std::invalid_argument on an unknown word; nullopt, with a printed note, for a malloc whose
// library is not installed (a bench runs the variants it can and says which it skipped).
inline std::optional<BaselineVariant> parse_baseline_variant(const std::string& name) {
  const size_t plus = name.find('+');
  const std::string mode = name.substr(0, plus), malloc_name = plus == std::string::npos ? "" : name.substr(plus + 1);
  const std::map<std::string, bool> modes{{"eager", false}, {"compile", true}};
  struct Malloc {
    std::string tunable, library, package;
  };
  const std::map<std::string, Malloc> mallocs{{"", {}},
                                              {"hugetlb", {"glibc.malloc.hugetlb=1", "", ""}},
                                              {"tcmalloc", {"", "libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"}},
                                              {"jemalloc", {"", "libjemalloc.so.2", "libjemalloc2"}}};
  if (!modes.contains(mode) || !mallocs.contains(malloc_name))
    throw std::invalid_argument("--baselines: unknown variant \"" + name +
                                "\" (eager or compile, then +hugetlb, +tcmalloc, +jemalloc or nothing)");
  BaselineVariant b{name, modes.at(mode), {}, modes.at(mode) ? "torch.compile" : "PyTorch eager"};
  const Malloc& m = mallocs.at(malloc_name);
  if (!m.tunable.empty()) {
    b.env.push_back("GLIBC_TUNABLES=" + m.tunable);
    b.setting += ", GLIBC_TUNABLES=" + m.tunable;
  } else if (!m.library.empty()) {
    const std::string path = find_library(m.library);
    if (path.empty()) {
      std::printf("baseline %s: skipped, %s is not installed (apt-get install %s)\n", name.c_str(), m.library.c_str(),
                  m.package.c_str());
      return std::nullopt;
    }
    b.env.push_back("LD_PRELOAD=" + path);
    b.setting += ", LD_PRELOAD=" + path;
  } else {
    b.setting += ", glibc malloc defaults";
  }
  return b;
}

// A comma-separated list of variants, those that can run here.
inline std::vector<BaselineVariant> parse_baseline_variants(const std::string& list) {
  std::vector<BaselineVariant> out;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');)
    if (auto b = parse_baseline_variant(name)) out.push_back(*b);
  return out;
}

// The last lines of a child's stderr log, indented: why a baseline did not run.
inline std::string tail_of(const std::filesystem::path& log, size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "    " + all[i] + "\n";
  return out;
}

// Starts a variant's child (argv, plus --compile when compiled) with its environment and `extra_env`,
// its stderr to `log`, and reads its first line into *ready. nullptr when it failed to get there (an
// {"error": ...} line, or no line at all): the failure is printed with the log's tail, and a bench goes
// on without that variant.
inline std::unique_ptr<PythonChild> start_baseline(const BaselineVariant& b, std::vector<std::string> argv,
                                                   const std::vector<std::string>& extra_env,
                                                   const std::filesystem::path& log, nlohmann::json* ready) {
  if (b.compile) argv.push_back("--compile");
  std::vector<std::string> env = b.env;
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::string failed;
  std::unique_ptr<PythonChild> child;
  try {
    child = std::make_unique<PythonChild>(argv, env, log.string());
    *ready = child->read();
    if (ready->contains("error")) failed = ready->at("error").get<std::string>();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  if (failed.empty()) return child;
  std::printf("baseline %s: did not run: %s\n%s", b.name.c_str(), failed.c_str(), tail_of(log, 12).c_str());
  return nullptr;
}

// One timed step of a running variant (`step` counts from 1): its answer goes to record(answer).
// When the child fails (it died, or its answer lacks what record reads), the failure is printed
// with the log's tail, the child is ended and *why (when given) says why it stopped; a bench goes on with the
// other variants. Returns whether the step was recorded.
template <class Record>
bool baseline_step(const BaselineVariant& b, std::unique_ptr<PythonChild>& child, int64_t step,
                   const std::filesystem::path& log, Record&& record, std::string* why = nullptr) {
  try {
    record(child->request("step"));
    return true;
  } catch (const std::exception& e) {
    const std::string reason = "stopped at timed step " + std::to_string(step) + ": " + e.what();
    std::printf("baseline %s: %s\n%s", b.name.c_str(), reason.c_str(), tail_of(log, 12).c_str());
    if (why) *why = reason;
    child.reset();
    return false;
  }
}

}  // namespace deepen::bench
