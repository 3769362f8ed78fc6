// cache_prefetch_bench: does reading a teacher cache keep up with a student at the paper's shapes?
//   build/bench/cache_prefetch_bench [--tokens-per-s 4000] [--samples 64] [--steps 12] [--dir /tmp/x]
// Writes a cache of synthetic draws at the paper's shapes (V = 151,936, documents of 8,192 tokens,
// micro-batches of 2 documents, K draws per token from a Zipf teacher spread over the ids), then:
// 1. decode: TeacherCache::read of one micro-batch, tokens/s on one thread (median of the reads);
// 2. the student's wait: a loop that asks CacheTeacherSource for each micro-batch's targets and then
//    "computes" for micro-batch tokens / --tokens-per-s seconds (a sleep: on a GPU node the student's
//    forward and backward run on the GPU, leaving the CPU to the reader), once reading on use and
//    once with prefetch (the next micro-batch read while the current one computes, as the trainer
//    does); prints the mean wait per micro-batch and its share of the step.
// --tokens-per-s: one student rank's training tokens/s. The default is the paper config's, from
// `deepen plan configs/paper/qwen3-8b.toml --nodes 2 --cluster h200` (its students' tokens/s over 8
// students, docs/performance.md gives the line); a faster GPU or a smaller student raises it.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include "bench/median.h"
#include "config/text_file.h"
#include "teacher_cache/cache_file.h"
#include "teacher_cache/cache_manifest.h"
#include "teacher_cache/cache_teacher_source.h"
#include "teacher_cache/teacher_cache.h"
#include "train/batch_source.h"
#include "train/compute_threads.h"

namespace {

using namespace deepen;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Micro-batch i of the loop is documents 2i, 2i + 1 of the train split.
class DocumentPairs : public BatchSource {
 public:
  MicroBatch train(int64_t step, int64_t student, int64_t micro) const override {
    MicroBatch mb;
    mb.step = step;
    mb.student = student;
    mb.index = micro;
    mb.labels = at::zeros({2, 8192}, at::kLong);
    return mb;
  }
  MicroBatch eval(int64_t) const override { return {}; }
  int64_t eval_batches() const override { return 0; }
  MicroBatch diagnostic() const override { return {}; }
  std::vector<int64_t> identity(const BatchKey& key) const override { return {0, 2 * key.step, 2 * key.step + 1}; }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cache_prefetch_bench: teacher cache decode rate and the student's wait, with and without prefetch"};
  double tokens_per_s = 4000;
  int64_t samples = 64, steps = 12, vocab = 151936, tokens = 8192;
  std::string dir = (fs::temp_directory_path() / "deepen_cache_prefetch_bench").string();
  app.add_option("--tokens-per-s", tokens_per_s, "one student rank's training tokens/s (default: the paper config's)");
  app.add_option("--samples", samples, "K draws per token");
  app.add_option("--steps", steps, "micro-batches in each loop");
  app.add_option("--dir", dir, "where the synthetic cache is written (removed after)");
  CLI11_PARSE(app, argc, argv);
  set_compute_threads(1);
  const int64_t documents = 2 * steps;

  // The synthetic cache: one file of `documents` documents of `tokens` tokens.
  fs::remove_all(dir);
  fs::create_directories(fs::path(dir) / "train");
  at::manual_seed(0);
  const at::Tensor zipf = at::pow(at::arange(1, vocab + 1, at::kDouble), -1.2);
  const at::Tensor cdf = at::cumsum(zipf / zipf.sum(), 0);
  const at::Tensor order = at::randperm(vocab, at::kLong);  // rank -> id: the likely ids spread over V
  CacheFileWriter writer((fs::path(dir) / "train" / "00000.cache").string(), static_cast<uint32_t>(samples), 0, 0);
  int64_t distinct = 0;
  for (int64_t d = 0; d < documents; ++d) {
    const at::Tensor ranks = at::searchsorted(cdf, at::rand({tokens, samples}, at::kDouble)).clamp_max(vocab - 1);
    const at::Tensor ids = std::get<0>(at::sort(order.index({ranks}), 1));
    const int64_t* p = ids.data_ptr<int64_t>();
    std::vector<CacheRecord> records(static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) {
      CacheRecord& r = records[static_cast<size_t>(t)];
      r.entropy = 2.0f;
      for (int64_t j = 0; j < samples; ++j) {
        const auto id = static_cast<uint32_t>(p[t * samples + j]);
        if (r.ids.empty() || r.ids.back() != id) r.ids.push_back(id), r.counts.push_back(1);
        else ++r.counts.back();
      }
      distinct += static_cast<int64_t>(r.ids.size());
    }
    writer.append_sequence(records);
  }
  const CacheFileHeader h = writer.commit();
  CacheManifest m;
  m.vocab = vocab;
  m.samples = samples;
  m.train_sequences = documents;
  m.train_records = documents * tokens;
  m.files.push_back({"train/00000.cache", 0, 0, documents, documents * tokens,
                     fs::file_size(fs::path(dir) / "train" / "00000.cache"), h.payload_hash});
  write_file_text(cache_manifest_path(dir), cache_manifest_json(m), "bench manifest");
  const auto cache = TeacherCache::open(dir);
  const double bytes_per_token = static_cast<double>(m.bytes()) / static_cast<double>(m.train_records);
  std::printf("synthetic cache: V = %lld, K = %lld, %.1f distinct ids per token, %.1f bytes/token, %lld documents of %lld tokens\n",
              static_cast<long long>(vocab), static_cast<long long>(samples),
              static_cast<double>(distinct) / static_cast<double>(m.train_records), bytes_per_token,
              static_cast<long long>(documents), static_cast<long long>(tokens));

  // 1. Decode rate on one thread.
  DocumentPairs batches;
  std::vector<double> reads;
  for (int64_t s = 0; s < steps; ++s) {
    const MicroBatch mb = batches.train(s, 0, 0);
    const auto t0 = Clock::now();
    const TeacherTargets t = cache->read(0, {2 * s, 2 * s + 1}, mb.labels, CacheTargets::kSampled);
    reads.push_back(since(t0));
  }
  const double micro_tokens = 2.0 * static_cast<double>(tokens);
  const double decode = micro_tokens / median(reads);
  std::printf("decode: %.0f tokens/s on one thread (median of %lld micro-batches of %.0f tokens: %.1f ms), %.1f MB/s of cache; "
              "%.1fx the student's %.0f tokens/s\n",
              decode, static_cast<long long>(steps), micro_tokens, 1e3 * median(reads), decode * bytes_per_token / 1e6,
              decode / tokens_per_s, tokens_per_s);

  // 2. The student's wait per micro-batch, reading on use vs prefetching.
  const double compute_s = micro_tokens / tokens_per_s;
  for (bool prefetch : {false, true}) {
    CacheTeacherSource source(cache, batches, CacheTargets::kSampled, at::kCPU);
    double wait = 0;
    const auto start = Clock::now();
    for (int64_t s = 0; s < steps; ++s) {
      const MicroBatch mb = batches.train(s, 0, 0);
      const auto t0 = Clock::now();
      const TeacherTargets t = source.targets(mb);
      wait += since(t0);
      if (prefetch && s + 1 < steps) source.prefetch(batches.train(s + 1, 0, 0));
      std::this_thread::sleep_for(std::chrono::duration<double>(compute_s));
    }
    const double total = since(start);
    std::printf("%-9s wait %.2f ms per micro-batch (%.2f%% of the step; compute %.0f ms per micro-batch)\n",
                prefetch ? "prefetch:" : "on use:", 1e3 * wait / static_cast<double>(steps), 100 * wait / total, 1e3 * compute_s);
  }
  fs::remove_all(dir);
  return 0;
}
