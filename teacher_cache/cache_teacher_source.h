// CacheTeacherSource: the TeacherSource of a run with distill.source = "cache": targets read from a
// teacher cache, the next micro-batch's read on a thread of its own while the current one computes.
#pragma once

#include <atomic>
#include <deque>
#include <future>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "config/options.h"
#include "train/batch_source.h"
#include "train/teacher_source.h"

namespace deepen {

class TeacherCache;

// Which sequences a micro-batch holds comes from the run's BatchSource (identity(): the split, then
// its sequences in row order), so any data order, seed, micro-batch size or layout reads the same
// cache. Train batches get `train_targets` (sampled: RS-KD, or the stored top-k), eval batches the
// validation split's draws at τ = 1 (val KL is then an unbiased estimate: train/distill_loss.h).
// Prefetch: prefetch(next) starts decoding `next` on a thread while the trainer computes the current
// micro-batch (the trainer calls it as it does for a logit channel: train/student_trainer.cpp), so
// targets() only waits when a read takes longer than a micro-batch's compute
// (bench/cache_prefetch_bench measures both at the paper's per-rank token rate).
class CacheTeacherSource : public TeacherSource {
 public:
  CacheTeacherSource(std::shared_ptr<const TeacherCache> cache, const BatchSource& batches, CacheTargets train_targets,
                     at::Device device);
  ~CacheTeacherSource() override;  // waits for reads in flight

  TeacherTargets targets(const MicroBatch& batch) override;
  void prefetch(const MicroBatch& next) override;
  // "cache:sampled:<K>" or "cache:topk:<k>": recorded in run.json, read by the report.
  std::string describe() const override;
  // Bytes of cache records read so far.
  int64_t channel_bytes() const override { return bytes_read_.load(); }

 private:
  TeacherTargets read(const MicroBatch& batch);
  struct Pending {
    BatchKey key;
    std::future<TeacherTargets> result;
  };
  std::shared_ptr<const TeacherCache> cache_;
  const BatchSource& batches_;
  CacheTargets train_targets_;
  at::Device device_;
  std::deque<Pending> pending_;
  std::atomic<int64_t> bytes_read_{0};
};

}  // namespace deepen
