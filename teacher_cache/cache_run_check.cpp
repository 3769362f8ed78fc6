// A run's teacher cache checked before any work (see cache_run_check.h).
#include "teacher_cache/cache_run_check.h"

#include <algorithm>
#include <filesystem>

#include "config/input_error.h"
#include "data/tokenizer.h"
#include "teacher_cache/cache_writer.h"
#include "teacher_cache/teacher_cache.h"
#include "train/shard_batch_source.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

int64_t largest_item(const std::vector<int64_t>& identity) {
  int64_t m = -1;
  for (size_t i = 1; i < identity.size(); ++i) m = std::max(m, identity[i]);
  return m;
}

}  // namespace

SequencesRead sequences_read(const RunPlan& run, const BatchSource& batches) {
  SequencesRead r;
  const int64_t steps = run.schedule.total_steps();
  for (int64_t step = 0; step < steps; ++step)
    for (int64_t s = 0; s < run.counts.students; ++s)
      for (int64_t m = 0; m < run.counts.grad_accum; ++m) {
        const std::vector<int64_t> id = batches.identity({BatchKind::kTrain, step, s, m});
        r.train_end = std::max(r.train_end, largest_item(id) + 1);
        r.train_samples += static_cast<int64_t>(id.size()) - 1;
      }
  for (int64_t e = 0; e < batches.eval_batches(); ++e)
    r.valid_end = std::max(r.valid_end, largest_item(batches.identity({BatchKind::kEval, 0, 0, e})) + 1);
  return r;
}

CacheForRun open_cache_for_run(const RunPlan& run, const Tokenizer& tokenizer, const BatchSource& batches,
                               const std::string& run_dir) {
  const Config& cfg = run.cfg;
  const std::string where = (cfg.overridden.count("cache.dir") ? "--set " : cfg.source + ": ") + "cache.dir = " + cfg.cache.dir;
  CacheForRun out;
  try {
    out.cache = TeacherCache::open(cfg.cache.dir);
  } catch (const InputError& e) {
    throw InputError(where + ": " + e.what());
  }
  const CacheManifest& have = out.cache->manifest();

  // 1. The cache this config would make, compared field by field (what the run reads is step 2's).
  const ShardSet train = open_data_split(cfg.data.train, cfg.data, tokenizer);
  const ShardSet valid = open_data_split(cfg.data.valid, cfg.data, tokenizer);
  const uint64_t fingerprint = cfg.teacher.checkpoint.empty() ? have.teacher_fingerprint : teacher_fingerprint(cfg.teacher.checkpoint);
  Config as_made = cfg;
  if (cfg.cache.targets != CacheTargets::kTopk) as_made.cache.topk = have.topk;  // stored beside, unused
  // The identity alone: how many sequences the cache holds is step 2's question, asked in this run's terms.
  CacheManifest want = cache_identity(as_made, tokenizer, run.vocab, train, valid, fingerprint, have.teacher_weights_hash);
  want.train_sequences = have.train_sequences;
  want.valid_sequences = have.valid_sequences;
  const std::vector<std::string> diffs = manifest_differences(want, have);
  if (!diffs.empty()) {
    std::string msg = where + ": a teacher cache made for another config:";
    for (const std::string& d : diffs) msg += "\n  " + d + " (this run vs the cache)";
    throw InputError(msg + "\nmake this run's cache with `deepen cache CONFIG --out DIR`, or point cache.dir at it");
  }

  // 2. Every sequence the schedule and the evals read.
  const SequencesRead read = sequences_read(run, batches);
  const std::string item = cfg.data.packing == Packing::kDocuments ? "documents" : "sequences";
  if (read.train_end > have.train_sequences)
    throw InputError(where + ": the run's " + std::to_string(run.schedule.total_steps()) + " steps read " +
                     std::to_string(read.train_samples) + " train samples, up to train " + item.substr(0, item.size() - 1) +
                     " " + std::to_string(read.train_end - 1) + "; the cache holds the first " +
                     std::to_string(have.train_sequences) + " " + item + " (" + std::to_string(have.train_records) +
                     " tokens): make it with cache.train_sequences >= " + std::to_string(read.train_end) +
                     " (0 = all of data.train)");
  if (read.valid_end > have.valid_sequences)
    throw InputError(where + ": an eval reads the first " + std::to_string(read.valid_end) + " validation " + item +
                     "; the cache holds " + std::to_string(have.valid_sequences) + " (" + std::to_string(have.valid_records) +
                     " tokens): make it with cache.valid_sequences >= " + std::to_string(read.valid_end));

  // 3. Every file's bytes against its hash, once per run.
  std::vector<FileToVerify> files;
  for (const CacheFileEntry& f : have.files) files.push_back({(fs::path(cfg.cache.dir) / f.path).string(), f.hash});
  out.verification = verify_files_once(run_dir, files, [&](const FileToVerify& f) {
    const auto it = std::find_if(out.cache->files().begin(), out.cache->files().end(),
                                 [&](const CacheFile& c) { return fs::equivalent(c.path(), f.path); });
    const uint64_t got = it->hash_payload();
    if (got != f.hash)
      throw InputError(where + ": teacher cache file corrupt: " + f.path + ": its bytes hash to " + hash_hex(got) +
                       ", its manifest lists " + hash_hex(f.hash) + " (make the cache again, or copy the file again)");
  });
  return out;
}

}  // namespace deepen
