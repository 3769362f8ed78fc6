// Students' collectives over a Communicator: gradient buckets, parameter broadcasts, checksum checks.
#include "dist/comm_student_group.h"

#include <sstream>

#include <ATen/ATen.h>

#include "dist/communicator.h"

namespace deepen {

CommStudentGroup::CommStudentGroup(Communicator& students, std::vector<int> world_ranks, int64_t bucket_bytes)
    : comm_(students), world_ranks_(std::move(world_ranks)), bucket_bytes_(bucket_bytes) {}

int64_t CommStudentGroup::rank() const { return comm_.rank(); }
int64_t CommStudentGroup::size() const { return comm_.size(); }

template <class Op> void CommStudentGroup::bucketed(const std::vector<at::Tensor>& tensors, Op op) {
  // Buckets hold consecutive tensors of one dtype; every student has the same parameters in the
  // same order (checked by checksum after growth), so buckets line up across ranks.
  size_t i = 0;
  while (i < tensors.size()) {
    const at::ScalarType dtype = tensors[i].scalar_type();
    size_t j = i;
    int64_t bytes = 0;
    while (j < tensors.size() && tensors[j].scalar_type() == dtype &&
           (j == i || bytes + static_cast<int64_t>(tensors[j].nbytes()) <= bucket_bytes_)) {
      bytes += static_cast<int64_t>(tensors[j].nbytes());
      ++j;
    }
    std::vector<at::Tensor> flat;
    for (size_t k = i; k < j; ++k) flat.push_back(tensors[k].reshape({-1}));
    // On the communicator's device: a CUDA student over MPI stages its buckets through host
    // memory; copy_ below brings the result back to the parameters' device.
    at::Tensor bucket = at::cat(flat).to(comm_.device());
    op(bucket);
    int64_t offset = 0;
    for (size_t k = i; k < j; ++k) {
      const int64_t n = tensors[k].numel();
      tensors[k].copy_(bucket.narrow(0, offset, n).view(tensors[k].sizes()));
      offset += n;
    }
    i = j;
  }
}

void CommStudentGroup::average(const std::vector<at::Tensor>& tensors) {
  if (comm_.size() == 1) return;
  bucketed(tensors, [&](at::Tensor& b) { comm_.all_reduce_avg(b); });
}

void CommStudentGroup::broadcast_from_first(const std::vector<at::Tensor>& tensors) {
  if (comm_.size() == 1) return;
  bucketed(tensors, [&](at::Tensor& b) { comm_.broadcast(b, 0); });
}

namespace {

// Runs `op(in, out)` on the communicator's device: a CUDA student over MPI stages both tensors
// through host memory; tensors already there (and contiguous) are used as they are.
template <class Op>
void on_comm_device(const Communicator& comm, const at::Tensor& input, const at::Tensor& output, Op op) {
  const at::Tensor in = input.to(comm.device()).contiguous();
  const bool direct = output.device() == comm.device() && output.is_contiguous();
  const at::Tensor out = direct ? output : at::empty(output.sizes(), output.options().device(comm.device()));
  op(in, out);
  if (!direct) output.copy_(out);
}

}  // namespace

void CommStudentGroup::reduce_scatter_avg(const at::Tensor& full, const at::Tensor& shard) {
  if (comm_.size() == 1) {
    shard.copy_(full);
    return;
  }
  on_comm_device(comm_, full, shard, [&](const at::Tensor& in, const at::Tensor& out) { comm_.reduce_scatter_avg(in, out); });
}

void CommStudentGroup::all_gather(const at::Tensor& shard, const at::Tensor& full) {
  if (comm_.size() == 1) {
    full.copy_(shard);
    return;
  }
  on_comm_device(comm_, shard, full, [&](const at::Tensor& in, const at::Tensor& out) { comm_.all_gather_into(in, out); });
}

namespace {

// A posted collective of the communicator; a finished one (single student, or done at once).
class CommPending final : public StudentGroup::Pending {
 public:
  explicit CommPending(std::unique_ptr<Request> request) : request_(std::move(request)) {}
  void wait() override {
    if (request_) request_->wait();
  }
  bool test() override { return !request_ || request_->test(); }

 private:
  std::unique_ptr<Request> request_;
};

}  // namespace

bool CommStudentGroup::overlaps_on(const at::Device& device) const { return device == comm_.device(); }

std::unique_ptr<StudentGroup::Pending> CommStudentGroup::start_average(const at::Tensor& bucket) {
  if (comm_.size() == 1) return std::make_unique<CommPending>(nullptr);
  if (!overlaps_on(bucket.device()) || !bucket.is_contiguous()) {  // staged: at once
    average({bucket});
    return std::make_unique<CommPending>(nullptr);
  }
  return std::make_unique<CommPending>(comm_.iall_reduce_avg(bucket));
}

std::unique_ptr<StudentGroup::Pending> CommStudentGroup::start_reduce_scatter_avg(const at::Tensor& full,
                                                                                  const at::Tensor& shard) {
  if (comm_.size() == 1 || !overlaps_on(full.device()) || !overlaps_on(shard.device()) || !full.is_contiguous() ||
      !shard.is_contiguous()) {
    reduce_scatter_avg(full, shard);
    return std::make_unique<CommPending>(nullptr);
  }
  return std::make_unique<CommPending>(comm_.ireduce_scatter_avg(full, shard));
}

std::vector<double> CommStudentGroup::sum(const std::vector<double>& values) {
  at::Tensor t = at::tensor(values, at::kDouble).to(comm_.device());  // NCCL reduces device memory only
  if (comm_.size() > 1) comm_.all_reduce_sum(t);
  t = t.to(at::kCPU);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

void CommStudentGroup::check_same(uint64_t checksum, const std::string& what, int64_t step) {
  const std::vector<uint64_t> all = comm_.all_gather(checksum);
  std::ostringstream differ;
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) differ << " student " << r << " (rank " << world_ranks_[r] << ")";
  }
  if (!differ.str().empty())
    throw std::runtime_error("students disagree on " + what + " at step " + std::to_string(step) +
                             ": student 0 (rank " + std::to_string(world_ranks_[0]) + ") differs from" +
                             differ.str());
}

}  // namespace deepen
