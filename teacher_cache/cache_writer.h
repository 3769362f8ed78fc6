// `deepen cache`: the teacher over a run's training and validation data, K draws per token written
// into a teacher cache (files aligned with the token shards, each written atomically and hashed;
// resumable after a kill; a Slurm array over its files).
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

#include "config/config.h"
#include "data/token_shards.h"
#include "teacher_cache/cache_manifest.h"

namespace deepen {

class Tokenizer;

// What a config's cache is keyed on, the part of plan_cache that needs no sequence counts: the
// teacher, tokenizer, vocabulary, packing and length, the shards' identities and the draws
// (cache.samples, cache.topk, cache.seed, τ). A run checks its cache against this first, so that a
// cache of another packing or length is named as such rather than by the sequence counts that follow
// from it (which need not fit this config's data). Sequence counts 0, no files. Pure in its inputs.
CacheManifest cache_identity(const Config& cfg, const Tokenizer& tokenizer, int64_t vocab, const ShardSet& train,
                             const ShardSet& valid, uint64_t teacher_fingerprint, uint64_t teacher_weights_hash);

// What a config's cache holds, before anything is computed: the teacher's, tokenizer's and data's
// identity, the draws (cache.samples, cache.topk, cache.seed, τ = distill.temperature for train and
// 1 for validation) and the files, one per token shard that holds a cached sequence:
//   windows:   file k holds the sequences that start in shard k (sequence i starts at token i·seq_len)
//   documents: file k holds the documents that end in shard k (its document index lists them)
// each cut to the first cache.train_sequences (0 = all) train and cache.valid_sequences (0 = the eval
// set: data.valid_documents, else eval.batches × parallel.micro_batch) validation sequences.
// Example (windows, seq_len 100, train shards of 250 and 250 tokens: 4 sequences starting at 0, 100,
// 200, 300): train/00000.cache = sequences 0..2 (first 0), train/00001.cache = sequence 3 (first 3).
// Files' bytes and hashes are 0. Pure in its inputs (the shards' headers and indexes, fingerprints).
// InputError when a count asks for more sequences than the split holds.
CacheManifest plan_cache(const Config& cfg, const Tokenizer& tokenizer, int64_t vocab, const ShardSet& train,
                         const ShardSet& valid, uint64_t teacher_fingerprint, uint64_t teacher_weights_hash);

struct CacheWriteOptions {
  std::string out_dir;         // the cache folder
  int64_t part = 0;            // this task writes the files f with f mod parts == part (a Slurm array)
  int64_t parts = 1;
  bool print_progress = true;
};

struct CacheWriteStats {
  int64_t files_written = 0, files_kept = 0;  // computed now; found complete and kept
  int64_t records = 0;                        // target positions written now
  int64_t bytes = 0;                          // their bytes
  double seconds = 0;
  bool complete = false;                      // manifest.json written (every file present)
};

// Writes (or resumes) the cache of `cfg` into options.out_dir. First plan.json: an existing one must
// describe the same cache (InputError naming each difference and the folder otherwise; with a
// manifest.json too, the cache is complete and nothing is done). Then this part's files, each
// through a temporary name and a rename: a file already in place is kept when its header, index and
// payload hash are those planned (a kill leaves only a temporary, which is written again), so a
// resumed cache is byte for byte the one an uninterrupted writer makes (each token's draws depend
// only on the seed and its place). Last, when every file of every part is in place, manifest.json
// with each file's size and hash. The teacher (teacher.checkpoint, whole, in teacher.dtype) runs on
// `device`, parallel.micro_batch sequences at a time.
CacheWriteStats write_cache(const Config& cfg, const Tokenizer& tokenizer, const CacheWriteOptions& options,
                            at::Device device);

}  // namespace deepen
