// MpiCommunicator: the Communicator backend over MPI for CPU tensors (tests, CI, laptops), and the
// host-side bootstrap of the NCCL backend.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace deepen {

class AbortState;

// Every call that waits is non-blocking MPI (MPI_Isend, MPI_Iallreduce, MPI_Ibarrier, ...) completed
// by a polling loop that also watches the abort flag: MPI itself cannot interrupt a blocked
// MPI_Recv, and the watchdog must be able to. The loop spins for the first 50 µs, yields until 2 ms,
// then sleeps between polls for 1/64 of the time waited (50 µs to 1 ms, dist/wait_backoff.h), so
// that oversubscribed ranks (tests on 2 cores) do not starve each other. Abort is noticed within
// about 1 ms plus one MPI_Testall.
// bf16/fp16 sums are computed in fp32 (MPI has no bf16 type) and rounded back once.
class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor unless aborted) and sets its error handler
  // to MPI_ERRORS_RETURN, so MPI failures become CommError instead of killing the job.
  MpiCommunicator(MPI_Comm comm, int64_t max_message_bytes, std::shared_ptr<AbortState> state);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kMpi; }
  at::Device device() const override { return at::kCPU; }

  void send(const at::Tensor& tensor, int dst, int tag = 0) override;
  void recv(const at::Tensor& out, int src, int tag = 0) override;
  std::unique_ptr<Request> isend(const at::Tensor& tensor, int dst, int tag = 0) override;
  std::unique_ptr<Request> irecv(const at::Tensor& out, int src, int tag = 0) override;
  std::unique_ptr<Request> batch_isend_irecv(const std::vector<P2POp>& ops) override;

  void broadcast(const at::Tensor& tensor, int root) override;
  void all_reduce_sum(const at::Tensor& tensor) override;
  void all_reduce_avg(const at::Tensor& tensor) override;
  std::unique_ptr<Request> ireduce_scatter_avg(const at::Tensor& input, const at::Tensor& output) override;
  std::unique_ptr<Request> iall_gather_into(const at::Tensor& input, const at::Tensor& output) override;
  std::unique_ptr<Request> iall_reduce_avg(const at::Tensor& tensor) override;
  std::vector<int64_t> all_gather(int64_t value) override;
  std::vector<uint64_t> all_gather(uint64_t value) override;
  void barrier() override;

  std::unique_ptr<Communicator> split(int color, int key) override;
  void abort() override;
  bool aborted() const override;
  void set_activity(std::shared_ptr<control::TrainerActivity> activity) override;

  // Host-side helpers for the NCCL bootstrap and startup checks (blocking, not abortable).
  std::vector<std::string> all_gather_strings(const std::string& value);
  void broadcast_bytes(void* data, int64_t bytes, int root);
  std::unique_ptr<MpiCommunicator> split_mpi(int color, int key);
  MPI_Comm comm() const { return comm_; }
  const std::shared_ptr<AbortState>& abort_state() const { return state_; }

 private:
  // One operation's MPI requests (several when a large tensor goes in pieces), what each receive
  // expects, and the tensors the transfer touches (kept alive until it completes).
  struct Op {
    std::vector<MPI_Request> requests;
    std::vector<int64_t> expected_bytes;  // per request: bytes a receive expects; -1 otherwise
    std::vector<at::Tensor> keep;
    std::string what;  // for errors: "recv from rank 2 tag 7 (4096 bytes)"
    // Runs once when every request has completed (a mean's division, unpacking pieces).
    std::function<void()> finish;
  };
  void post_send(Op& op, const at::Tensor& tensor, int dst, int tag);
  void post_recv(Op& op, const at::Tensor& out, int src, int tag);
  // Polls until done (wait) or once (test); throws CommError on an MPI error, a size mismatch or
  // abort. On abort, pending receives are cancelled and the op's requests and tensors are parked in
  // abandoned_* (never freed: MPI may still touch them).
  void wait(Op& op);
  bool test(Op& op);
  void abandon(Op& op);
  void check_open(const std::string& what);
  // Sum over ranks in place (bf16/fp16 through an fp32 copy).
  void reduce_in_place(const at::Tensor& tensor, const std::string& what);
  // Posts that sum (fp32/fp64/integer `work`) without waiting.
  Op post_reduce(const at::Tensor& work, const std::string& what);
  // One value from every rank, in rank order (abortable, as the collectives above): the int64 and
  // uint64 all_gather.
  template <class T>
  std::vector<T> all_gather_value(T value, MPI_Datatype type, const char* what);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int64_t max_message_bytes_;
  std::shared_ptr<AbortState> state_;
  // What an aborted transfer may still write to or read from; kept until the process ends.
  std::vector<MPI_Request> abandoned_requests_;
  std::vector<at::Tensor> abandoned_tensors_;

  friend class MpiRequest;  // calls wait/test on its Op
};

}  // namespace deepen
