// CommStudentGroup: the data-parallel students' agreement (bucketed gradient mean, sharded
// reduce-scatter and all-gather, broadcasts, checksums) over the all-students communicator.
#pragma once

#include <cstdint>

#include "train/student_group.h"

namespace deepen {

class Communicator;

class CommStudentGroup : public StudentGroup {
 public:
  // `students`: the communicator of all student ranks (rank = student index). `world_ranks[i]` is
  // student i's world rank, for messages. bucket_bytes: gradients are flattened into buckets of
  // about this size so a few large all-reduces replace one per parameter.
  CommStudentGroup(Communicator& students, std::vector<int> world_ranks, int64_t bucket_bytes = 32 << 20);

  int64_t rank() const override;
  int64_t size() const override;
  void average(const std::vector<at::Tensor>& tensors) override;
  void broadcast_from_first(const std::vector<at::Tensor>& tensors) override;
  void reduce_scatter_avg(const at::Tensor& full, const at::Tensor& shard) override;
  void all_gather(const at::Tensor& shard, const at::Tensor& full) override;
  std::unique_ptr<Pending> start_average(const at::Tensor& bucket) override;
  std::unique_ptr<Pending> start_reduce_scatter_avg(const at::Tensor& full, const at::Tensor& shard) override;
  bool overlaps_on(const at::Device& device) const override;
  std::vector<double> sum(const std::vector<double>& values) override;
  void check_same(uint64_t checksum, const std::string& what, int64_t step) override;

 private:
  // Runs `op` on flat buckets of same-dtype tensors, copying results back.
  template <class Op> void bucketed(const std::vector<at::Tensor>& tensors, Op op);
  Communicator& comm_;
  std::vector<int> world_ranks_;
  int64_t bucket_bytes_;
};

}  // namespace deepen
