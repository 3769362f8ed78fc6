// Tokenizer throughput: deepen's Qwen3 BPE against Hugging Face `tokenizers` (encode_batch, Rust,
// bench/prep_bench_hf.py) on the same documents and the same number of threads, in one run.
//
//   build-x/bench/prep_bench [--threads 2] [--repeat 3] [--source DIR] [--tokenizer tokenizer.json]
//
// Text: every *.txt under --source (default: python3.11-doc's reST sources, 11 MB, 497 files), one
// document per file, as `deepen prep` reads them. Time: best of --repeat runs of encoding all
// documents, excluding file reading and tokenizer loading (on both sides); deepen's threads take
// documents from a shared counter, HF's run under RAYON_NUM_THREADS=--threads. The ratio printed
// is deepen tokens/s over HF tokens/s (goal >= 1.0); token counts must agree. CPU seconds (all
// threads of the process) are printed too: on a machine shared with other work, wall time mostly
// measures the scheduler, and tokens per CPU-second is the fairer comparison.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "tests/test_paths.h"

namespace fs = std::filesystem;

// CPU seconds of this process, all threads.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int main(int argc, char** argv) {
  int threads = 2, repeat = 3;
  std::string source = "/usr/share/doc/python3.11/html/_sources";
  std::string tokenizer = deepen::test::kQwen3Tokenizer;
  bool baseline = true;
  CLI::App app{"deepen tokenizer throughput vs Hugging Face tokenizers"};
  app.add_option("--threads", threads, "threads on both sides");
  app.add_option("--repeat", repeat, "runs; the best is reported");
  app.add_option("--source", source, "folder of *.txt documents");
  app.add_option("--tokenizer", tokenizer, "Qwen3 tokenizer.json");
  app.add_flag("!--no-baseline", baseline, "skip the Hugging Face run");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> paths;
  for (const auto& e : fs::recursive_directory_iterator(source))
    if (e.is_regular_file() && e.path().extension() == ".txt") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) {
    std::cerr << "prep_bench: no *.txt files under " << source << "\n";
    return 2;
  }
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    docs.push_back(ss.str());
    bytes += docs.back().size();
  }
  const auto tok = deepen::make_tokenizer("qwen3:" + tokenizer);

  double best = 1e30, cpu_best = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    std::atomic<size_t> next{0}, count{0};
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        std::vector<int32_t> ids;
        size_t local = 0;
        for (size_t i; (i = next.fetch_add(1)) < docs.size();) {
          ids.clear();
          tok->encode_append(docs[i], ids);
          local += ids.size();
        }
        count += local;
      });
    }
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cpu_best = std::min(cpu_best, cpu_seconds() - c0);
    tokens = count;
  }
  std::printf("text: %zu documents, %.2f MB from %s; %d threads, best of %d\n", docs.size(), bytes / 1e6,
              source.c_str(), threads, repeat);
  std::printf("deepen:        %6.2f MB/s %7.3f Mtokens/s (%zu tokens, %.3f s wall, %.3f s CPU)\n", bytes / 1e6 / best,
              tokens / 1e6 / best, tokens, best, cpu_best);
  if (!baseline) return 0;

  const fs::path list = fs::temp_directory_path() / ("prep_bench_files_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream out(list);
    for (const auto& p : paths) out << p << "\n";
  }
  const std::string cmd = "RAYON_NUM_THREADS=" + std::to_string(threads) + " TOKENIZERS_PARALLELISM=true " +
                          deepen::test::kPython + " " + deepen::test::kSourceDir + "/bench/prep_bench_hf.py --tokenizer " +
                          tokenizer + " --files " + list.string() + " --repeat " + std::to_string(repeat);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (pipe && std::fgets(buf, sizeof buf, pipe)) out += buf;
  const int rc = pipe ? ::pclose(pipe) : -1;
  fs::remove(list);
  if (rc != 0 || out.empty()) {
    std::cerr << "prep_bench: baseline failed: " << cmd << "\n";
    return 1;
  }
  const nlohmann::json hf = nlohmann::json::parse(out);
  const double hf_s = hf["seconds"].get<double>();
  const double hf_cpu = hf["cpu_seconds"].get<double>();
  const size_t hf_tokens = hf["tokens"].get<size_t>();
  std::printf("HF tokenizers: %6.2f MB/s %7.3f Mtokens/s (%zu tokens, %.3f s wall, %.3f s CPU)\n", bytes / 1e6 / hf_s,
              hf_tokens / 1e6 / hf_s, hf_tokens, hf_s, hf_cpu);
  std::printf("ratio deepen/HF tokens per second: %.2f (wall), %.2f (per CPU-second)%s\n",
              (double(tokens) / best) / (double(hf_tokens) / hf_s), (double(tokens) / cpu_best) / (double(hf_tokens) / hf_cpu),
              tokens == hf_tokens ? "" : "  (token counts differ!)");
  return tokens == hf_tokens ? 0 : 1;
}
