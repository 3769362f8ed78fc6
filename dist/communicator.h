// Communicator: one interface for moving tensors between ranks (point-to-point, collectives, groups,
// abort), with an MPI backend for CPU tensors and an NCCL backend for CUDA tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/options.h"

namespace deepen {

namespace control {
class TrainerActivity;
}
class MpiSession;
struct RankLayout;

// A communication failure: a peer's message of the wrong size, an MPI/NCCL error, or abort().
// Distinct from InputError (the user's fault) and from std::invalid_argument (a caller's bug, e.g.
// a non-contiguous tensor or a CUDA tensor given to the MPI backend).
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

// An operation in flight (isend/irecv). The tensor stays referenced until the request completes, so
// its memory cannot be freed under the transfer. A request must not outlive its communicator.
class Request {
 public:
  virtual ~Request() = default;  // an unfinished request waits in its destructor (errors are logged)
  // Returns when the tensor may be reused (send) or read (recv); throws CommError on failure or
  // abort. For NCCL, "read" is stream-ordered: work queued afterwards on the current CUDA stream
  // sees the data; the host is not blocked.
  virtual void wait() = 0;
  // True once complete (then wait() returns at once); throws CommError on failure or abort.
  virtual bool test() = 0;
};

// Returns once `request` has completed on the host as well: for MPI that is wait(); for NCCL,
// whose wait() only orders the current stream, it also polls test(). Bounded in-flight queues use
// it: stream-ordered waits alone would let a sender run ahead with unbounded device memory queued.
void wait_on_host(Request& request);

// All tensors must be contiguous, on the backend's device (CPU for "mpi", this rank's CUDA device
// for "nccl"), and have the same dtype and number of elements on every rank taking part.
//
// Matching: MPI matches point-to-point messages by (source, tag), in order for equal tags; NCCL has
// no tags and matches in issue order per pair. Code that must run on both posts sends and receives
// between any two ranks in the same order on both sides; tags are then only a check (MPI).
// Large messages are split into pieces below MPI's 2^31 count limit; that is invisible to callers.
//
// Thread safety: one thread drives a communicator; abort() may be called from any thread.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;  // kMpi or kNccl
  // Where this communicator's tensors must live: CPU for "mpi", this rank's GPU for "nccl". Callers
  // computing elsewhere copy to it before sending and from it after receiving (host staging).
  virtual at::Device device() const = 0;

  // Point-to-point, bit-exact for every dtype (bytes are moved, never converted). recv writes into
  // `out` in place; a message whose size differs from out's is a CommError naming both sizes.
  // tag: 0..32767.
  virtual void send(const at::Tensor& tensor, int dst, int tag = 0) = 0;
  virtual void recv(const at::Tensor& out, int src, int tag = 0) = 0;
  virtual std::unique_ptr<Request> isend(const at::Tensor& tensor, int dst, int tag = 0) = 0;
  virtual std::unique_ptr<Request> irecv(const at::Tensor& out, int src, int tag = 0) = 0;
  // Several sends and receives posted together as one request (NCCL: one ncclGroupStart/End, so
  // that e.g. a rank sending to one peer while receiving from another cannot deadlock).
  struct P2POp {
    enum Kind { kSend, kRecv } kind;
    at::Tensor tensor;
    int peer;
    int tag = 0;
  };
  virtual std::unique_ptr<Request> batch_isend_irecv(const std::vector<P2POp>& ops) = 0;

  // Collectives (every rank of the communicator calls them in the same order), in place.
  virtual void broadcast(const at::Tensor& tensor, int root) = 0;
  // Floating or integer dtypes; the result is identical (bit for bit) on every rank.
  virtual void all_reduce_sum(const at::Tensor& tensor) = 0;
  // Sum / size(); floating dtypes only.
  virtual void all_reduce_avg(const at::Tensor& tensor) = 0;
  // Sharded data parallelism (one flat bucket split into size() equal chunks, chunk r owned by
  // rank r). reduce_scatter_avg: `output` (n elements) becomes the mean over ranks of
  // input[rank()·n, (rank()+1)·n), input holding size()·n elements of output's floating dtype
  // (bf16/fp16 are summed in fp32 and rounded once). all_gather_into: output[r·n, (r+1)·n) becomes
  // rank r's `input` (n elements), bytes moved, bit-exact for every dtype.
  // The i-forms return at once; the result may be read after wait() (NCCL: stream-ordered, as for
  // point-to-point). They let a trainer launch a bucket's reduction while the backward pass still
  // computes the next one. Every rank posts the same collectives in the same order.
  virtual std::unique_ptr<Request> ireduce_scatter_avg(const at::Tensor& input, const at::Tensor& output) = 0;
  virtual std::unique_ptr<Request> iall_gather_into(const at::Tensor& input, const at::Tensor& output) = 0;
  // all_reduce_avg, posted: the mean is in `tensor` after wait().
  virtual std::unique_ptr<Request> iall_reduce_avg(const at::Tensor& tensor) = 0;
  void reduce_scatter_avg(const at::Tensor& input, const at::Tensor& output) {
    ireduce_scatter_avg(input, output)->wait();
  }
  void all_gather_into(const at::Tensor& input, const at::Tensor& output) { iall_gather_into(input, output)->wait(); }
  // One value per rank, indexed by rank (checksum agreement, step agreement).
  virtual std::vector<int64_t> all_gather(int64_t value) = 0;
  virtual std::vector<uint64_t> all_gather(uint64_t value) = 0;
  virtual void barrier() = 0;

  // Collective over this communicator: ranks passing the same color >= 0 form a new communicator in
  // which they are ordered by key. color < 0: the rank joins none and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Makes every blocked or later call on this communicator, its requests and every communicator split
  // from it throw CommError, so a watchdog can unblock the training thread and stop the job (aborting
  // the world aborts the groups too). Callable from any thread; idempotent. An aborted communicator
  // cannot be used again; its MPI/NCCL resources are abandoned, not freed (the process is ending).
  virtual void abort() = 0;
  virtual bool aborted() const = 0;

  // Marks this communicator's blocking waits (and NCCL's posted operations until they finish) in
  // `activity`, and those of every communicator split from it, before or after: the watchdog then
  // tells a rank that waits on others from one that computes (dist/control/activity.h). Null: none.
  virtual void set_activity(std::shared_ptr<control::TrainerActivity> activity) { (void)activity; }
};

// The world communicator for a resolved parallel.backend (kMpi or kNccl: dist/run_device.h's
// world_backend decides, and refuses NCCL without a GPU or a build with it). NCCL picks this rank's
// GPU from its node-local rank (choose_cuda_device), checks that no two ranks share a GPU, and
// bootstraps its unique id over MPI. Collective over MPI_COMM_WORLD. nccl_setup_timeout_s
// (control.nccl_setup_timeout_s) bounds each NCCL communicator's set-up; see nccl_communicator.h.
std::unique_ptr<Communicator> make_communicator(Backend backend, const MpiSession& mpi, double nccl_setup_timeout_s);

// The MPI world communicator (a duplicate of MPI_COMM_WORLD with its own error handling).
// max_message_bytes: largest single MPI message; larger tensors go as several (tests lower it).
std::unique_ptr<Communicator> make_mpi_communicator(const MpiSession& mpi,
                                                    int64_t max_message_bytes = int64_t{1} << 30);

// True when this build has the NCCL backend (DEEPEN_WITH_NCCL).
bool nccl_available();

// The communicators of one rank for a layout, split from the world (collective over it): null where
// the rank is not a member. Ranks inside each are ordered as RankLayout::group_ranks lists them.
struct RankGroups {
  std::unique_ptr<Communicator> teacher_pipeline;  // teachers: the stages of its pipeline
  std::unique_ptr<Communicator> logit_channel;     // last teacher stage (rank 0) + its students
  std::unique_ptr<Communicator> students;          // students: all students
};
RankGroups make_rank_groups(Communicator& world, const RankLayout& layout);

}  // namespace deepen
