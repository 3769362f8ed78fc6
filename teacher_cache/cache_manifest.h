// A teacher cache's manifest.json: what made it (teacher, tokenizer, data, sampling), what it holds,
// and every file with its size and hash; and the teacher's identity the manifest names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"

namespace deepen {

// The files of a cache folder; only teacher_cache/ knows these names.
//   <dir>/manifest.json             written last, when every file is in place (atomic)
//   <dir>/plan.json                 written first: the manifest without the files' hashes, so a
//                                   resumed or parallel writer proves it writes the same cache
//   <dir>/train/<shard>.cache       the targets of the train sequences of token shard <shard>.bin
//   <dir>/valid/<shard>.cache       (cache_file.h); a writer's temporary is <name>.cache.tmp
std::string cache_manifest_path(const std::string& dir);
std::string cache_plan_path(const std::string& dir);

// A token shard as the cache names it: its file name and what its header says of its contents.
struct ShardIdentity {
  std::string name;           // "00000.bin"
  uint64_t payload_hash = 0;  // the shard header's (data/token_shards.h)
  int64_t tokens = 0;
  bool operator==(const ShardIdentity&) const = default;
};

struct CacheFileEntry {
  std::string path;            // relative to the cache folder: "train/00000.cache"
  int64_t split = 0;           // 0 train, 1 validation
  int64_t first_sequence = 0;  // the split's index of its first sequence
  int64_t sequences = 0;
  int64_t records = 0;         // target positions
  uint64_t bytes = 0;          // file size (0 in plan.json)
  uint64_t hash = 0;           // its payload hash (cache_file.h; 0 in plan.json)
};

// Everything that decides the cache's contents (compared between a writer and its plan, and, the
// parts a run fixes, between a run and the cache it trains from).
struct CacheManifest {
  // The teacher: its folder as given, its fingerprint (teacher_fingerprint), the hash of its weights
  // files whole (teacher_weights_hash), the dtype it computed in, its vocabulary.
  std::string teacher_checkpoint;
  uint64_t teacher_fingerprint = 0;
  uint64_t teacher_weights_hash = 0;
  FloatDtype teacher_dtype = FloatDtype::kFp32;
  int64_t vocab = 0;
  // The tokenizer (data.tokenizer and Tokenizer::fingerprint) and how sequences are made.
  std::string tokenizer;
  uint64_t tokenizer_fingerprint = 0;
  Packing packing = Packing::kWindows;
  int64_t seq_len = 0;  // windows
  int64_t max_len = 0;  // documents
  std::vector<ShardIdentity> train_shards, valid_shards;
  // What is cached: the first train_sequences / valid_sequences of each split.
  int64_t train_sequences = 0, valid_sequences = 0;
  int64_t train_records = 0, valid_records = 0;
  // The draws: K per token at τ (validation at τ = 1, what eval scores), their seed, the top-k kept.
  int64_t samples = 0, topk = 0, seed = 0;
  double train_temperature = 1, valid_temperature = 1;
  std::vector<CacheFileEntry> files;

  int64_t bytes() const;  // all files
};

std::string cache_manifest_json(const CacheManifest& m);
// Throws InputError naming `path` and the field when it is not a manifest this deepen reads.
CacheManifest parse_cache_manifest(const std::string& text, const std::string& path);
// <dir>/manifest.json; InputError naming it when missing ("not a finished teacher cache") or malformed.
CacheManifest read_cache_manifest(const std::string& dir);

// The fields of `want` and `have` that differ (the files' bytes and hashes not compared), each as
// "<field>: <want> vs <have>". Example: samples 64 vs 8 -> {"samples (cache.samples): 64 vs 8"}.
std::vector<std::string> manifest_differences(const CacheManifest& want, const CacheManifest& have);

// The teacher's fingerprint: hash64 chained over config.json's bytes and, for every *.safetensors
// file of `dir` in name order, its size, its JSON header and 64 blocks of 64 KiB spread evenly over
// its data: about 4 MiB read per file whatever its size, and different for any two checkpoints that
// differ in shape, dtype or trained values (a fine-tune changes every block). A run from a cache
// compares it, not the whole-weights hash, so that starting one never reads the teacher whole.
// Throws InputError naming the file when config.json or the weights are missing.
uint64_t teacher_fingerprint(const std::string& dir);
// hash64 of every *.safetensors file whole, chained in name order: a full read of the weights
// (several GB/s); `deepen cache` records it.
uint64_t teacher_weights_hash(const std::string& dir);

// "0123456789abcdef" and back (InputError naming `what` when not 16 hex digits).
std::string hash_hex(uint64_t v);
uint64_t parse_hash_hex(const std::string& text, const std::string& what);

}  // namespace deepen
