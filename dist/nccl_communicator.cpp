// NCCL backend of Communicator: stream-ordered collectives and point-to-point on CUDA tensors, its
// unique id bootstrapped over MPI, ncclCommAbort for the watchdog.
#include "dist/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <thread>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dist/abort_state.h"
#include "dist/mpi_communicator.h"
#include "dist/mpi_session.h"
#include "dist/rank_layout.h"
#include "dist/run_device.h"
#include "dist/setup_deadline.h"
#include "dist/wait_backoff.h"

// Non-blocking set-up (ncclConfig_t.blocking, ncclCommGetAsyncError polling) needs NCCL 2.14+.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0), "deepen needs nccl.h from NCCL 2.14 or newer");

namespace deepen {
namespace {

constexpr int kMaxTag = 32767;  // same range as the MPI backend, so code runs unchanged on both

void check_cuda(cudaError_t rc, const std::string& what) {
  if (rc != cudaSuccess) throw CommError("CUDA " + what + ": " + cudaGetErrorString(rc));
}

ncclDataType_t nccl_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    default:
      throw std::invalid_argument("NcclCommunicator: unsupported dtype " + std::string(c10::toString(dtype)));
  }
}

// A CUDA event marking the end of one operation on the communication stream.
class CudaEvent {
 public:
  CudaEvent() { check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate"); }
  ~CudaEvent() { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class NcclCommunicator;

class NcclRequest final : public Request {
 public:
  NcclRequest(NcclCommunicator* comm, std::shared_ptr<CudaEvent> done, std::string what)
      : comm_(comm), done_(std::move(done)), what_(std::move(what)) {}
  void wait() override;
  bool test() override;

 private:
  NcclCommunicator* comm_;
  std::shared_ptr<CudaEvent> done_;
  std::string what_;
};

// The world ranks of `comm`'s members, in its rank order (for messages).
std::vector<int> world_ranks_of(MPI_Comm comm, int size) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> local(static_cast<size_t>(size)), out(static_cast<size_t>(size));
  std::iota(local.begin(), local.end(), 0);
  MPI_Group_translate_ranks(group, size, local.data(), world, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}

std::string this_host() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Polls an MPI request until it completes or the set-up deadline passes (MPI cannot time out a
// blocked collective itself). Returns false on timeout, leaving the request pending: the caller
// throws and the process ends, so the request is abandoned, not freed.
bool mpi_request_done_by(MPI_Request& request, double timeout_s) {
  return wait_with_deadline(
      [&] {
        int done = 0;
        if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) throw CommError("NCCL set-up: MPI_Test failed");
        return done ? SetupPoll::kDone : SetupPoll::kPending;
      },
      [] { return std::chrono::steady_clock::now(); },
      [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }, timeout_s);
}

class NcclCommunicator final : public Communicator {
 public:
  // Set-up in three steps, each under control.nccl_setup_timeout_s, so a hang ends the job with a
  // message instead of waiting for the Slurm time limit (the control plane's watchdog starts only
  // after the communicators exist: it needs the world to share its secret):
  //  1. every rank of the group arrives (MPI barrier on the bootstrap communicator);
  //  2. rank 0's unique id reaches every rank (MPI broadcast);
  //  3. ncclCommInitRankConfig in non-blocking mode, polled with ncclCommGetAsyncError; at the
  //     deadline ncclCommAbort ends NCCL's connection attempts and a CommError names the group,
  //     this rank and the NCCL network env (setup_timeout_message).
  NcclCommunicator(std::unique_ptr<MpiCommunicator> mpi, int device, double setup_timeout_s)
      : mpi_(std::move(mpi)),
        device_(device),
        setup_timeout_s_(setup_timeout_s),
        state_(mpi_->abort_state()),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device))) {
    SetupTimeout timeout;
    timeout.group_world_ranks = world_ranks_of(mpi_->comm(), mpi_->size());
    timeout.world_rank = timeout.group_world_ranks.at(static_cast<size_t>(mpi_->rank()));
    timeout.host = this_host();
    timeout.device = device_;
    timeout.timeout_s = setup_timeout_s_;
    auto fail = [&](SetupStage stage) {
      timeout.stage = stage;
      mpi_->abort();  // its communicator has a collective pending: abandon it, do not free it
      throw CommError(setup_timeout_message(timeout, nccl_network_env([](const char* n) { return std::getenv(n); })));
    };

    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(mpi_->comm(), &request) != MPI_SUCCESS) throw CommError("NCCL set-up: MPI_Ibarrier failed");
    if (!mpi_request_done_by(request, setup_timeout_s_)) fail(SetupStage::kRanksArriving);
    ncclUniqueId id;
    if (mpi_->rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, mpi_->comm(), &request) != MPI_SUCCESS)
      throw CommError("NCCL set-up: MPI_Ibcast failed");
    if (!mpi_request_done_by(request, setup_timeout_s_)) fail(SetupStage::kRanksArriving);

    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, mpi_->size(), id, mpi_->rank(), &config), "ncclCommInitRankConfig");
    const bool connected = wait_with_deadline(
        [&] {
          ncclResult_t async = ncclSuccess;
          check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
          if (async == ncclInProgress) return SetupPoll::kPending;
          check(async, "ncclCommInitRankConfig");
          return SetupPoll::kDone;
        },
        [] { return std::chrono::steady_clock::now(); },
        [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }, setup_timeout_s_);
    if (!connected) {
      ncclCommAbort(comm_);
      fail(SetupStage::kNcclConnecting);
    }
    // One abort flag for this communicator and its MPI twin: aborting either stops both.
    state_->set_on_abort([comm = comm_] { ncclCommAbort(comm); });
  }

  ~NcclCommunicator() override {
    state_->set_on_abort(nullptr);  // from here on the hook has run or never will
    if (!state_->aborted()) ncclCommDestroy(comm_);
  }

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  Backend backend() const override { return Backend::kNccl; }
  at::Device device() const override { return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)); }

  void send(const at::Tensor& tensor, int dst, int tag) override {
    isend(tensor, dst, tag)->wait();
  }
  void recv(const at::Tensor& out, int src, int tag) override { irecv(out, src, tag)->wait(); }
  std::unique_ptr<Request> isend(const at::Tensor& tensor, int dst, int tag) override {
    return batch_isend_irecv({P2POp{P2POp::kSend, tensor, dst, tag}});
  }
  std::unique_ptr<Request> irecv(const at::Tensor& out, int src, int tag) override {
    return batch_isend_irecv({P2POp{P2POp::kRecv, out, src, tag}});
  }

  std::unique_ptr<Request> batch_isend_irecv(const std::vector<P2POp>& ops) override {
    std::vector<at::Tensor> tensors;
    std::string what;
    for (const P2POp& p : ops) {
      check_tensor(p.tensor, p.kind == P2POp::kSend ? "send" : "recv");
      if (p.peer < 0 || p.peer >= size())
        throw std::invalid_argument("NcclCommunicator: rank " + std::to_string(p.peer) + " outside a communicator of " +
                                    std::to_string(size()));
      if (p.tag < 0 || p.tag > kMaxTag)
        throw std::invalid_argument("NcclCommunicator: tag " + std::to_string(p.tag) + " outside 0.." +
                                    std::to_string(kMaxTag));
      tensors.push_back(p.tensor);
      what += std::string(what.empty() ? "" : ", ") + (p.kind == P2POp::kSend ? "send to" : "recv from") +
              " rank " + std::to_string(p.peer);
    }
    auto done = enqueue(tensors, what, [&](cudaStream_t s) {
      check(ncclGroupStart(), "ncclGroupStart");
      for (const P2POp& p : ops) {
        if (p.kind == P2POp::kSend)
          check(ncclSend(p.tensor.data_ptr(), p.tensor.nbytes(), ncclUint8, p.peer, comm_, s), "ncclSend");
        else
          check(ncclRecv(p.tensor.data_ptr(), p.tensor.nbytes(), ncclUint8, p.peer, comm_, s), "ncclRecv");
      }
      complete(ncclGroupEnd(), "ncclGroupEnd");
    });
    return std::make_unique<NcclRequest>(this, std::move(done), what);
  }

  void broadcast(const at::Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast");
    auto done = enqueue({tensor}, "broadcast", [&](cudaStream_t s) {
      complete(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.nbytes(), ncclUint8, root, comm_, s),
            "ncclBroadcast");
    });
    order_current_after(*done);
  }

  void all_reduce_sum(const at::Tensor& tensor) override { all_reduce(tensor, ncclSum, "all_reduce_sum"); }
  void all_reduce_avg(const at::Tensor& tensor) override {
    if (!at::isFloatingType(tensor.scalar_type()))
      throw std::invalid_argument("NcclCommunicator::all_reduce_avg: needs a floating dtype");
    all_reduce(tensor, ncclAvg, "all_reduce_avg");
  }

  std::unique_ptr<Request> ireduce_scatter_avg(const at::Tensor& input, const at::Tensor& output) override {
    check_tensor(input, "reduce_scatter_avg");
    check_tensor(output, "reduce_scatter_avg");
    if (!at::isFloatingType(output.scalar_type()) || input.scalar_type() != output.scalar_type() ||
        input.numel() != output.numel() * size())
      throw std::invalid_argument("NcclCommunicator::reduce_scatter_avg: needs input of size() x output's elements, "
                                  "one floating dtype");
    const ncclDataType_t type = nccl_type(output.scalar_type());
    auto done = enqueue({input, output}, "reduce_scatter_avg", [&](cudaStream_t s) {
      complete(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type, ncclAvg, comm_, s),
               "ncclReduceScatter");
    });
    return std::make_unique<NcclRequest>(this, std::move(done), "reduce_scatter_avg");
  }
  std::unique_ptr<Request> iall_gather_into(const at::Tensor& input, const at::Tensor& output) override {
    check_tensor(input, "all_gather_into");
    check_tensor(output, "all_gather_into");
    if (input.scalar_type() != output.scalar_type() || output.numel() != input.numel() * size())
      throw std::invalid_argument("NcclCommunicator::all_gather_into: output must hold size() x input's elements");
    auto done = enqueue({input, output}, "all_gather_into", [&](cudaStream_t s) {
      complete(ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8, comm_, s),
               "ncclAllGather");
    });
    return std::make_unique<NcclRequest>(this, std::move(done), "all_gather_into");
  }
  std::unique_ptr<Request> iall_reduce_avg(const at::Tensor& tensor) override {
    check_tensor(tensor, "all_reduce_avg");
    if (!at::isFloatingType(tensor.scalar_type()))
      throw std::invalid_argument("NcclCommunicator::all_reduce_avg: needs a floating dtype");
    const ncclDataType_t type = nccl_type(tensor.scalar_type());
    auto done = enqueue({tensor}, "all_reduce_avg", [&](cudaStream_t s) {
      complete(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type, ncclAvg, comm_, s),
               "ncclAllReduce");
    });
    return std::make_unique<NcclRequest>(this, std::move(done), "all_reduce_avg");
  }

  std::vector<int64_t> all_gather(int64_t value) override { return mpi_->all_gather(value); }
  std::vector<uint64_t> all_gather(uint64_t value) override { return mpi_->all_gather(value); }
  void barrier() override { mpi_->barrier(); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    auto child = mpi_->split_mpi(color, key);  // adopts the child's abort flag
    if (!child) return nullptr;
    return std::make_unique<NcclCommunicator>(std::move(child), device_, setup_timeout_s_);
  }

  void abort() override { state_->abort(); }
  bool aborted() const override { return state_->aborted(); }
  // The MPI twin shares the state: its waits (bootstrap, scalars, barrier) are marked too.
  void set_activity(std::shared_ptr<control::TrainerActivity> activity) override { state_->set_activity(activity); }

  // Throws CommError when aborted or when NCCL reports an asynchronous error (a dead peer).
  void check_open(const std::string& what) {
    if (state_->aborted()) throw CommError("rank " + std::to_string(rank()) + ": " + what + ": communicator aborted");
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress)
      throw CommError("rank " + std::to_string(rank()) + ": " + what + ": NCCL: " + ncclGetErrorString(async));
  }

  // The caller's current stream waits for `done` (stream-ordered completion).
  void order_current_after(const CudaEvent& done) {
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
    check_cuda(cudaStreamWaitEvent(current.stream(), done.get(), 0), "cudaStreamWaitEvent");
  }

 private:
  void check(ncclResult_t rc, const char* what) {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    throw CommError(std::string("NCCL ") + what + " on rank " + std::to_string(mpi_->rank()) + ": " +
                    ncclGetErrorString(rc) + (comm_ ? std::string(" (") + ncclGetLastError(comm_) + ")" : ""));
  }

  // A non-blocking communicator (see the constructor) may answer ncclInProgress while NCCL still
  // connects peers (lazily, at first use). Waits for it, watching the abort flag so the watchdog can
  // still end a hang, so that callers see each NCCL call complete as in blocking mode.
  void complete(ncclResult_t rc, const char* what) {
    WaitBackoff backoff;
    while (rc == ncclInProgress) {
      if (state_->aborted()) throw CommError("rank " + std::to_string(mpi_->rank()) + ": " + what + ": communicator aborted");
      backoff.pause();
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &async);
      rc = q != ncclSuccess ? q : async;
    }
    check(rc, what);
  }

  void check_tensor(const at::Tensor& t, const char* op) const {
    if (!t.defined()) throw std::invalid_argument(std::string("NcclCommunicator::") + op + ": undefined tensor");
    if (!t.is_cuda() || t.device().index() != device_)
      throw std::invalid_argument(std::string("NcclCommunicator::") + op + ": tensor on " + t.device().str() +
                                  ", expected cuda:" + std::to_string(device_));
    if (!t.is_contiguous())
      throw std::invalid_argument(std::string("NcclCommunicator::") + op + ": tensor is not contiguous");
  }

  // Runs `op` on the communication stream after the current stream's queued work; the tensors'
  // memory is marked in use by the communication stream so the caching allocator does not hand it
  // out again before the transfer ends. Returns the event that marks the end.
  template <class Op>
  std::shared_ptr<CudaEvent> enqueue(const std::vector<at::Tensor>& tensors, const std::string& what, Op&& op) {
    check_open(what);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
    CudaEvent ready;
    check_cuda(cudaEventRecord(ready.get(), current.stream()), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_.stream(), ready.get(), 0), "cudaStreamWaitEvent");
    op(stream_.stream());
    for (const at::Tensor& t : tensors)
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    auto done = std::make_shared<CudaEvent>();
    check_cuda(cudaEventRecord(done->get(), stream_.stream()), "cudaEventRecord");
    // Waiting for the watchdog until the GPU has run it: the host may meanwhile spin in a CUDA sync
    // behind it, which looks like computing (dist/control/activity.h).
    if (control::TrainerActivity* activity = state_->activity())
      activity->pending(what, [done] { return cudaEventQuery(done->get()) != cudaErrorNotReady; });
    return done;
  }

  void all_reduce(const at::Tensor& tensor, ncclRedOp_t red, const char* what) {
    check_tensor(tensor, what);
    const ncclDataType_t type = nccl_type(tensor.scalar_type());
    auto done = enqueue({tensor}, what, [&](cudaStream_t s) {
      complete(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type, red, comm_, s), "ncclAllReduce");
    });
    order_current_after(*done);
  }

  std::unique_ptr<MpiCommunicator> mpi_;  // same ranks: bootstrap, scalars, barrier, split
  int device_;
  double setup_timeout_s_;  // control.nccl_setup_timeout_s, for this communicator and its splits
  std::shared_ptr<AbortState> state_;
  c10::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
};

void NcclRequest::wait() {
  comm_->check_open(what_);
  comm_->order_current_after(*done_);
}

bool NcclRequest::test() {
  comm_->check_open(what_);
  const cudaError_t rc = cudaEventQuery(done_->get());
  if (rc == cudaErrorNotReady) return false;
  check_cuda(rc, "cudaEventQuery");
  return true;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator> bootstrap, int device,
                                                    double setup_timeout_s) {
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), device, setup_timeout_s);
}

std::unique_ptr<Communicator> make_nccl_communicator(const MpiSession& mpi, double setup_timeout_s) {
  const int local_rank = node_local_rank([](const char* n) { return std::getenv(n); }, mpi.local_rank());
  const int device = choose_cuda_device(local_rank, c10::cuda::device_count());
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  char bus[64] = {};
  check_cuda(cudaDeviceGetPCIBusId(bus, sizeof(bus), device), "cudaDeviceGetPCIBusId");
  MPI_Comm world = MPI_COMM_NULL;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &world) != MPI_SUCCESS) throw CommError("MPI_Comm_dup failed");
  auto bootstrap = std::make_unique<MpiCommunicator>(world, int64_t{1} << 30, std::make_shared<AbortState>());
  check_distinct_devices(bootstrap->all_gather_strings(mpi.hostnames().at(mpi.rank()) + "/" + bus));
  return make_nccl_communicator(std::move(bootstrap), device, setup_timeout_s);
}

}  // namespace deepen
