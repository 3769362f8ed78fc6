// Teacher targets from a cache, read ahead on a thread (see cache_teacher_source.h).
#include "teacher_cache/cache_teacher_source.h"

#include <ATen/ATen.h>

#include "teacher_cache/teacher_cache.h"

namespace deepen {
namespace {

BatchKey key_of(const MicroBatch& mb) { return {mb.kind, mb.step, mb.student, mb.index}; }

}  // namespace

CacheTeacherSource::CacheTeacherSource(std::shared_ptr<const TeacherCache> cache, const BatchSource& batches,
                                       CacheTargets train_targets, at::Device device)
    : cache_(std::move(cache)), batches_(batches), train_targets_(train_targets), device_(device) {}

CacheTeacherSource::~CacheTeacherSource() {
  for (Pending& p : pending_)
    if (p.result.valid()) p.result.wait();
}

TeacherTargets CacheTeacherSource::read(const MicroBatch& batch) {
  const std::vector<int64_t> identity = batches_.identity(key_of(batch));
  const int64_t split = identity.front();
  const std::vector<int64_t> items(identity.begin() + 1, identity.end());
  bytes_read_ += cache_->bytes_of(split, items);
  const CacheTargets which = batch.kind == BatchKind::kTrain ? train_targets_ : CacheTargets::kSampled;
  return cache_->read(split, items, batch.labels, which);
}

void CacheTeacherSource::prefetch(const MicroBatch& next) {
  // The thread gets its own copy of the batch's labels and key: the trainer may drop `next` first.
  MicroBatch copy;
  copy.kind = next.kind;
  copy.step = next.step;
  copy.student = next.student;
  copy.index = next.index;
  copy.labels = next.labels;
  pending_.push_back({key_of(next), std::async(std::launch::async, [this, copy] { return read(copy); })});
}

TeacherTargets CacheTeacherSource::targets(const MicroBatch& batch) {
  const BatchKey key = key_of(batch);
  TeacherTargets t;
  // Batches are prefetched in the order they are asked for: one found among the reads in flight is
  // taken (reads prefetched before it and never asked for are finished and dropped); one asked for
  // without a prefetch (the first of an eval, or of a run) is read here.
  size_t at = 0;
  while (at < pending_.size() && !(pending_[at].key == key)) ++at;
  if (at < pending_.size()) {
    for (size_t i = 0; i < at; ++i) pending_.front().result.wait(), pending_.pop_front();
    t = pending_.front().result.get();  // rethrows the read's error here, on the trainer's thread
    pending_.pop_front();
  } else {
    t = read(batch);
  }
  for (at::Tensor* x : {&t.values, &t.indices, &t.sample_ids, &t.sample_weights, &t.entropy})
    if (x->defined()) *x = x->to(device_);
  return t;
}

std::string CacheTeacherSource::describe() const {
  const CacheManifest& m = cache_->manifest();
  if (train_targets_ == CacheTargets::kTopk) return "cache:topk:" + std::to_string(m.topk);
  return "cache:sampled:" + std::to_string(m.samples);
}

}  // namespace deepen
