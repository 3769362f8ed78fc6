// Tensor communication with CUDA compute in one process: the NCCL backend on one GPU (the student
// group's small tensors, the channel's headers), and the logit channel staging CUDA targets
// through an MPI (host memory) channel. GPU cases skip without CUDA; the CPU case always runs.
#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "dist/comm_student_group.h"
#include "dist/communicator.h"
#include "dist/logit_channel.h"
#include "dist/mpi_session.h"
#include "train/distill_loss.h"
#include "train/micro_batch.h"

namespace deepen {
namespace {

// MPI may be initialized once per process; ctest runs each test in its own process.
const MpiSession& session() {
  static MpiSession s;
  return s;
}

bool have_cuda() { return torch::cuda::is_available(); }

// A world of one seen as a two-rank channel: rank `as_rank` of {teacher 0, student 1}, every peer
// being this process. MPI buffers a send to self until the matching receive, so the teacher side
// can send a micro-batch that the student side then receives, in one thread. (NCCL cannot: a send
// to self waits on the same stream for a receive queued after it.)
class LoopbackChannel final : public Communicator {
 public:
  LoopbackChannel(Communicator& self, int as_rank) : self_(self), rank_(as_rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  Backend backend() const override { return self_.backend(); }
  at::Device device() const override { return self_.device(); }
  void send(const at::Tensor& t, int, int tag) override { self_.send(t, 0, tag); }
  void recv(const at::Tensor& t, int, int tag) override { self_.recv(t, 0, tag); }
  std::unique_ptr<Request> isend(const at::Tensor& t, int, int tag) override { return self_.isend(t, 0, tag); }
  std::unique_ptr<Request> irecv(const at::Tensor& t, int, int tag) override { return self_.irecv(t, 0, tag); }
  std::unique_ptr<Request> batch_isend_irecv(const std::vector<P2POp>& ops) override {
    std::vector<P2POp> mine = ops;
    for (auto& op : mine) op.peer = 0;
    return self_.batch_isend_irecv(mine);
  }
  void broadcast(const at::Tensor& t, int) override { self_.broadcast(t, 0); }
  void all_reduce_sum(const at::Tensor& t) override { self_.all_reduce_sum(t); }
  void all_reduce_avg(const at::Tensor& t) override { self_.all_reduce_avg(t); }
  std::unique_ptr<Request> ireduce_scatter_avg(const at::Tensor&, const at::Tensor&) override {
    throw std::logic_error("LoopbackChannel::ireduce_scatter_avg");
  }
  std::unique_ptr<Request> iall_gather_into(const at::Tensor&, const at::Tensor&) override {
    throw std::logic_error("LoopbackChannel::iall_gather_into");
  }
  std::unique_ptr<Request> iall_reduce_avg(const at::Tensor&) override {
    throw std::logic_error("LoopbackChannel::iall_reduce_avg");
  }
  std::vector<int64_t> all_gather(int64_t v) override { return {v, v}; }
  std::vector<uint64_t> all_gather(uint64_t v) override { return {v, v}; }
  void barrier() override { self_.barrier(); }
  std::unique_ptr<Communicator> split(int, int) override { throw std::logic_error("LoopbackChannel::split"); }
  void abort() override { self_.abort(); }
  bool aborted() const override { return self_.aborted(); }

 private:
  Communicator& self_;
  int rank_;
};

MicroBatch batch_of(const at::Tensor& ids, int64_t step) {
  MicroBatch mb;
  mb.step = step;
  mb.inputs = ids;
  mb.labels = ids;
  mb.checksum = ids_checksum(ids);
  return mb;
}

// Teacher logits on `device` go through an MPI channel (host memory) and come back as targets on
// `device`, bit for bit: full fp32, full bf16 and top-k.
void channel_round_trip(at::Device device) {
  auto world = make_mpi_communicator(session());
  LoopbackChannel teacher_side(*world, 0), student_side(*world, 1);
  const int64_t vocab = 50, k = 5;
  const at::Tensor ids = at::randint(0, vocab, {2, 6}, at::kLong);
  const at::Tensor logits = at::randn({12, vocab}, at::TensorOptions().device(device)) * 3;
  struct Mode {
    TeacherOutput logits;
    FloatDtype wire;
    const char* name;
  };
  for (const Mode m : {Mode{TeacherOutput::kFull, FloatDtype::kFp32, "full"},
                       Mode{TeacherOutput::kFull, FloatDtype::kBf16, "bf16"},
                       Mode{TeacherOutput::kTopk, FloatDtype::kFp32, "topk"}}) {
    const std::string mode = m.name;
    DistillConfig d;
    d.logits = m.logits;
    d.topk = k;
    d.channel_dtype = m.wire;
    const ChannelFormat format = channel_format(d);
    LogitChannelSender sender(teacher_side, format, /*first_student=*/0, /*max_in_flight=*/2);
    ChannelTeacherSource source(student_side, format, vocab, 0, 1, device);
    sender.send({BatchKind::kTrain, 7, 0, 0}, ids_checksum(ids), logits);
    const TeacherTargets got = source.targets(batch_of(ids, 7));
    sender.flush();
    if (m.logits == TeacherOutput::kTopk) {
      const TeacherTargets want = teacher_topk(logits, k, 1.0, 8192);
      ASSERT_TRUE(got.is_topk()) << mode;
      EXPECT_EQ(got.values.device(), device);
      EXPECT_EQ(got.indices.device(), device);
      EXPECT_TRUE(at::equal(got.values.cpu(), want.values.to(at::kFloat).cpu()));
      EXPECT_TRUE(at::equal(got.indices.cpu(), want.indices.to(at::kInt).cpu()));
    } else {
      ASSERT_TRUE(got.is_full()) << mode;
      EXPECT_EQ(got.logits.device(), device) << mode;
      const at::Tensor want = m.wire == FloatDtype::kBf16 ? logits.to(at::kBFloat16) : logits;
      EXPECT_TRUE(at::equal(got.logits.cpu(), want.cpu())) << mode;
    }
  }
}

TEST(LogitChannelStaging, CpuTargetsCrossAnMpiChannelBitExact) { channel_round_trip(at::kCPU); }

TEST(GpuLogitChannelStaging, CudaTargetsCrossAnMpiChannelThroughHostMemoryBitExact) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  channel_round_trip(at::Device(at::kCUDA, 0));
}

TEST(GpuNccl, OneRankWorldKeepsHeadersSumsAndBucketsOnItsGpu) {
  if (!nccl_available() || !have_cuda()) GTEST_SKIP() << "no NCCL build or no CUDA device";
  auto comm = make_communicator(Backend::kNccl, session(), 300);
  ASSERT_EQ(comm->backend(), Backend::kNccl);
  const at::Device gpu = comm->device();
  ASSERT_TRUE(gpu.is_cuda());

  // What the channel and the pipeline do with a header: int64 words on the GPU, read on the host.
  const at::Tensor header = at::arange(8, at::kLong).to(gpu);
  at::Tensor got = at::empty({8}, at::TensorOptions().dtype(at::kLong).device(gpu));
  comm->batch_isend_irecv({{Communicator::P2POp::kSend, header, 0, 11}, {Communicator::P2POp::kRecv, got, 0, 11}})
      ->wait();
  EXPECT_TRUE(at::equal(got.cpu(), at::arange(8, at::kLong)));

  // What CommStudentGroup::sum reduces: doubles, on the communicator's device.
  at::Tensor sums = at::tensor(std::vector<double>{1.5, -2.25, 1e300}, at::kDouble).to(gpu);
  comm->all_reduce_sum(sums);
  EXPECT_TRUE(at::equal(sums.cpu(), at::tensor(std::vector<double>{1.5, -2.25, 1e300}, at::kDouble)));

  // A resume-step broadcast (launch/distributed_job.cpp) and a host-side wait on a request.
  at::Tensor step = at::full({1}, int64_t{41}, at::TensorOptions().dtype(at::kLong).device(gpu));
  comm->broadcast(step, 0);
  EXPECT_EQ(step.item<int64_t>(), 41);
  at::Tensor payload = at::randn({64, 1000}, at::TensorOptions().device(gpu)).to(at::kBFloat16);
  at::Tensor into = at::empty_like(payload);
  auto req = comm->batch_isend_irecv({{Communicator::P2POp::kSend, payload, 0, 12},
                                      {Communicator::P2POp::kRecv, into, 0, 12}});
  wait_on_host(*req);
  EXPECT_TRUE(req->test());
  EXPECT_TRUE(at::equal(into.cpu(), payload.cpu()));

  CommStudentGroup group(*comm, {0});
  EXPECT_EQ(group.sum({3.0, 4.0}), (std::vector<double>{3.0, 4.0}));
  group.check_same(123, "parameters", 0);

  // Sharded data parallelism's collectives on NCCL (one rank: the mean is the value itself, the
  // gather the shard), posted and waited on the stream as the trainer does; and the posted mean.
  const at::Tensor full = at::randn({1000}, at::TensorOptions().device(gpu));
  at::Tensor shard = at::empty({1000}, at::TensorOptions().device(gpu));
  comm->ireduce_scatter_avg(full, shard)->wait();
  EXPECT_TRUE(at::equal(shard.cpu(), full.cpu()));
  at::Tensor gathered = at::empty({1000}, at::TensorOptions().dtype(at::kBFloat16).device(gpu));
  comm->iall_gather_into(full.to(at::kBFloat16), gathered)->wait();
  EXPECT_TRUE(at::equal(gathered.cpu(), full.to(at::kBFloat16).cpu()));
  at::Tensor mean = full.clone();
  comm->iall_reduce_avg(mean)->wait();
  EXPECT_TRUE(at::equal(mean.cpu(), full.cpu()));
  EXPECT_THROW(comm->reduce_scatter_avg(full, at::empty({999}, at::TensorOptions().device(gpu))), std::invalid_argument);
}

// The set-up deadline on real NCCL: with a limit far shorter than any set-up, the non-blocking
// ncclCommInitRankConfig is still in progress at the first check, so ncclCommAbort ends it and the
// error names the group, the key and the NCCL env; nothing hangs or crashes. (If this machine's
// set-up beat even that limit, the communicator simply works.) Then a normal set-up succeeds.
TEST(GpuNccl, SetupPastItsDeadlineAbortsWithTheGroupAndKeyNamedThenANewOneWorks) {
  if (!nccl_available() || !have_cuda()) GTEST_SKIP() << "no NCCL build or no CUDA device";
  try {
    auto rushed = make_communicator(Backend::kNccl, session(), 1e-9);
    EXPECT_EQ(rushed->backend(), Backend::kNccl);  // set-up beat the deadline: fine, it must work
    at::Tensor one = at::ones({1}, at::TensorOptions().device(rushed->device()));
    rushed->all_reduce_sum(one);
    EXPECT_EQ(one.item<float>(), 1.0f);
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("NCCL set-up of the group of world ranks 0 timed out on world rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("control.nccl_setup_timeout_s"), std::string::npos) << m;
  }
  auto comm = make_communicator(Backend::kNccl, session(), 300);
  at::Tensor x = at::full({4}, 2.5, at::TensorOptions().device(comm->device()));
  comm->all_reduce_sum(x);
  EXPECT_TRUE(at::equal(x.cpu(), at::full({4}, 2.5)));
}

}  // namespace
}  // namespace deepen
