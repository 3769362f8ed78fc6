// The checks a run from a teacher cache passes before any work: the cache is this config's (teacher,
// tokenizer, data, max_len/packing, τ, K, seed), holds every sequence the run's schedule reads, and
// every file is intact (hashed in full once per run).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "run_folder/verified_shards.h"
#include "train/batch_source.h"
#include "train/run_plan.h"

namespace deepen {

class TeacherCache;
class Tokenizer;

// The sequences a run reads, as indices of each split: train ones over its whole schedule
// (every step, student and micro-batch: BatchSource::identity), validation ones over one eval.
// Example: the demo's packed windows, 150 steps of 2 students × 1 micro-batch × 8 sequences ->
// train_end = the largest of the 2,400 samples + 1; valid_end = eval.batches × micro_batch.
struct SequencesRead {
  int64_t train_end = 0;  // every train sequence read is < train_end
  int64_t valid_end = 0;
  int64_t train_samples = 0;  // samples drawn over the schedule (a sequence may repeat)
};
SequencesRead sequences_read(const RunPlan& run, const BatchSource& batches);

struct CacheForRun {
  std::shared_ptr<const TeacherCache> cache;
  ShardVerification verification;  // the cache files' stamps, for the run's record (run_folder/verified_shards.h)
};

// Opens cache.dir (TeacherCache::open: manifest, files present with their sizes) and checks, in order:
//   1. the cache is this config's: the teacher (teacher_fingerprint of teacher.checkpoint when it is
//      given; teacher.dtype), data.tokenizer and its fingerprint, the vocabulary, data.packing and
//      data.seq_len (windows) or data.max_len (documents), the train and validation shards (names
//      and payload hashes), distill.temperature, cache.samples and cache.seed, and with
//      cache.targets = "topk" cache.topk;
//   2. it holds what the run reads (sequences_read): the run's schedule asking for a train sequence
//      past the cache's, or an eval for a validation sequence past it, is refused naming both;
//   3. every file's bytes against its hash, once per run (verify_files_once in `run_dir`'s record).
// Each an InputError naming cache.dir (and the file with its hash, for 3), before the run writes anything.
CacheForRun open_cache_for_run(const RunPlan& run, const Tokenizer& tokenizer, const BatchSource& batches,
                               const std::string& run_dir);

}  // namespace deepen
