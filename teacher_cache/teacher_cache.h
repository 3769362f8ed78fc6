// TeacherCache: a finished teacher cache opened for reading (its manifest, every file mapped), the
// targets of a micro-batch's sequences read out of it, and its files verified against their hashes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/options.h"
#include "teacher_cache/cache_file.h"
#include "teacher_cache/cache_manifest.h"
#include "train/distill_loss.h"

namespace deepen {

class TeacherCache {
 public:
  // Reads <dir>/manifest.json and maps every file it lists, checking each one's size against the
  // manifest and its header and index (cache_file.h); InputError naming the file, its expected hash
  // and the reason when one is missing, truncated or not the file listed. Contents are not hashed
  // here: files() with CacheFile::hash_payload does that (teacher_cache/cache_run_check.h, once per run).
  static std::shared_ptr<const TeacherCache> open(const std::string& dir);

  const CacheManifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  // The mapped files, in the manifest's order.
  const std::vector<CacheFile>& files() const { return files_; }

  // The targets of `items` (sequences or documents, in row order) of `split` (0 train, 1
  // validation), laid out like the micro-batch whose labels are `labels` [B, T]: row b's cached
  // records fill its positions in order, and must be exactly its targets (labels != kIgnoreLabel,
  // which come first: right padding). Rows flatten to N = B·T, padding rows with weight 0.
  //   sampled: ids [N, M] int64 and weights [N, M] fp32 (count / K, M = the most distinct ids of a
  //            row of the batch, padded with id 0 weight 0) and entropy [N] fp32
  //   topk:    the stored top-k: values [N, k] (log p_T^τ) fp32 and indices [N, k] int64 (a padding
  //            row gets ids 0..k−1 at log(1/k), never scored)
  // On the CPU. InputError naming the cache and the sequence when an item is not cached or its
  // records do not match the row; std::runtime_error when a record does not decode (corrupt file).
  TeacherTargets read(int64_t split, const std::vector<int64_t>& items, const at::Tensor& labels,
                      CacheTargets which) const;

  // Bytes of records a read of these items decodes (what the prefetch reads from disk).
  int64_t bytes_of(int64_t split, const std::vector<int64_t>& items) const;

 private:
  struct Location {
    const CacheFile* file = nullptr;
    int64_t index = 0;  // the sequence within the file
  };
  Location locate(int64_t split, int64_t item) const;

  std::string dir_;
  CacheManifest manifest_;
  std::vector<CacheFile> files_;
  std::vector<size_t> by_split_[2];  // indices into files_, each split's files by first sequence
};

}  // namespace deepen
