// StudentGroup: what data-parallel students agree on (gradients, new blocks, checksums, metrics).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepen {

// The trainer talks to its peers only through this. SoloStudentGroup is the single-process case;
// dist/ provides the one backed by the all-students communicator.
class StudentGroup {
 public:
  virtual ~StudentGroup() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  // Replaces each tensor by the mean over students (gradients after backward).
  virtual void average(const std::vector<at::Tensor>& tensors) = 0;
  // Copies student 0's values into every student's tensors (new blocks after growth).
  virtual void broadcast_from_first(const std::vector<at::Tensor>& tensors) = 0;
  // Sharded data parallelism (train/sharded_adamw.h), on one flat bucket of size()·n elements:
  // `shard` (n elements) becomes the students' mean of full[rank()·n, (rank()+1)·n);
  // all_gather fills full[r·n, (r+1)·n) with student r's shard, bit for bit.
  virtual void reduce_scatter_avg(const at::Tensor& full, const at::Tensor& shard) = 0;
  virtual void all_gather(const at::Tensor& shard, const at::Tensor& full) = 0;
  // The same two reductions posted without waiting, for a bucket launched while the backward pass
  // still runs (train/gradient_buckets.h); the result may be read after the handle's wait().
  // overlaps_on(device): whether posting from inside the backward pass is possible for tensors on
  // `device` (not when they would be staged through host memory: that is a blocking copy, and on
  // CUDA the backward's hooks run on another thread than the one driving MPI).
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;  // true once complete; drives MPI's progress when polled
  };
  virtual std::unique_ptr<Pending> start_average(const at::Tensor& bucket) = 0;
  virtual std::unique_ptr<Pending> start_reduce_scatter_avg(const at::Tensor& full, const at::Tensor& shard) = 0;
  virtual bool overlaps_on(const at::Device& device) const = 0;
  // Sum of a few doubles over students (loss sums, token counts).
  virtual std::vector<double> sum(const std::vector<double>& values) = 0;
  // Throws std::runtime_error naming `what`, the step and the disagreeing ranks unless every
  // student reports the same checksum.
  virtual void check_same(uint64_t checksum, const std::string& what, int64_t step) = 0;
};

class SoloStudentGroup : public StudentGroup {
 public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  void average(const std::vector<at::Tensor>&) override {}
  void broadcast_from_first(const std::vector<at::Tensor>&) override {}
  void reduce_scatter_avg(const at::Tensor& full, const at::Tensor& shard) override { shard.copy_(full); }
  void all_gather(const at::Tensor& shard, const at::Tensor& full) override { full.copy_(shard); }
  std::unique_ptr<Pending> start_average(const at::Tensor&) override { return std::make_unique<Done>(); }
  std::unique_ptr<Pending> start_reduce_scatter_avg(const at::Tensor& full, const at::Tensor& shard) override {
    shard.copy_(full);
    return std::make_unique<Done>();
  }
  bool overlaps_on(const at::Device&) const override { return true; }
  std::vector<double> sum(const std::vector<double>& values) override { return values; }
  void check_same(uint64_t, const std::string&, int64_t) override {}

 private:
  struct Done : Pending {
    void wait() override {}
    bool test() override { return true; }
  };
};

}  // namespace deepen
