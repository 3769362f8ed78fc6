// verified_shards.json: the token shards a run has verified in full, so each is read whole once per run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace deepen {

// Opening a shard checks its header, size and largest id (data/token_shards.h), not its tokens: an
// id changed to another valid id (a bad copy, a bit flip that stays in the vocabulary) trains
// silently. Only Shard::verify, a full read of the payload against its hash, finds it: at ~1 GB/s
// that is seconds per shard, which a run pays at its first start and not at every resume. A shard
// counts as verified while its size, modification time and header's payload hash are those
// recorded; anything else (a new copy, a re-run of prep) is verified again.
//   {"shards": [{"path": "/data/train/00000.bin", "bytes": 100000064, "mtime_ns": 1700000000123456789,
//                "payload_hash": "1f2e3d4c5b6a7988"}]}
struct ShardStamp {
  std::string path;  // absolute
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
  uint64_t payload_hash = 0;
  bool operator==(const ShardStamp&) const = default;
};

struct ShardVerification {
  std::vector<ShardStamp> stamps;  // every shard of the paths, for record_verified_shards
  int64_t verified = 0;            // how many were read in full now
  uint64_t verified_bytes = 0;
  double seconds = 0;              // spent verifying them
};

// Verifies every shard of `shard_files` (Shard::verify) that `run_dir`'s record does not hold with
// the same stamp; throws InputError naming the first shard whose tokens do not match its hash.
// Writes nothing: record_verified_shards does, once every start-up check has passed.
ShardVerification verify_shards_once(const std::string& run_dir, const std::vector<std::string>& shard_files);

// The same once-per-run verification for other inputs of the run that carry their own hash (a
// teacher cache's files, teacher_cache/cache_run_check.h): each file whose stamp (size, modification
// time and `hash`, the hash its header claims) the record does not hold is passed to `verify`, which
// throws (InputError naming the file) when its bytes do not match; the stamps join the record.
struct FileToVerify {
  std::string path;
  uint64_t hash = 0;
};
ShardVerification verify_files_once(const std::string& run_dir, const std::vector<FileToVerify>& files,
                                    const std::function<void(const FileToVerify&)>& verify);

// Replaces the record with `stamps` (temporary file + rename; throws naming the file on failure).
void record_verified_shards(const std::string& run_dir, const std::vector<ShardStamp>& stamps);

}  // namespace deepen
