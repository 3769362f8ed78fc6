// MPI backend of Communicator: non-blocking MPI completed by an abortable polling loop.
#include "dist/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include <ATen/ATen.h>

#include "dist/abort_state.h"
#include "dist/mpi_session.h"
#include "dist/wait_backoff.h"

namespace deepen {
namespace {

constexpr int kMaxTag = 32767;  // the MPI standard's guaranteed minimum of MPI_TAG_UB

std::string mpi_error(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, len);
}

void check_mpi(int rc, const std::string& what) {
  if (rc != MPI_SUCCESS) throw CommError("MPI " + what + ": " + mpi_error(rc));
}

void check_cpu_tensor(const at::Tensor& t, const char* op) {
  if (!t.defined()) throw std::invalid_argument(std::string("MpiCommunicator::") + op + ": undefined tensor");
  if (!t.device().is_cpu())
    throw std::invalid_argument(std::string("MpiCommunicator::") + op + ": tensor on " + t.device().str() +
                                "; the MPI backend moves CPU tensors");
  if (!t.is_contiguous())
    throw std::invalid_argument(std::string("MpiCommunicator::") + op + ": tensor is not contiguous");
}

void check_peer(int peer, int size, int tag, const char* op) {
  if (peer < 0 || peer >= size)
    throw std::invalid_argument(std::string("MpiCommunicator::") + op + ": rank " + std::to_string(peer) +
                                " outside a communicator of " + std::to_string(size));
  if (tag < 0 || tag > kMaxTag)
    throw std::invalid_argument(std::string("MpiCommunicator::") + op + ": tag " + std::to_string(tag) +
                                " outside 0.." + std::to_string(kMaxTag));
}

// MPI's element type for a reduction on `dtype`; MPI_DATATYPE_NULL when it must go through fp32.
MPI_Datatype reduce_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

// Byte pieces of at most `max_bytes`, as (offset, length).
std::vector<std::pair<int64_t, int64_t>> pieces(int64_t total, int64_t max_bytes) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t off = 0; off < total; off += max_bytes) out.emplace_back(off, std::min(max_bytes, total - off));
  if (out.empty()) out.emplace_back(0, 0);  // an empty tensor is still one (empty) message
  return out;
}

}  // namespace

// A posted isend/irecv/batch: completes through the communicator's polling loop.
class MpiRequest final : public Request {
 public:
  MpiRequest(MpiCommunicator* comm, MpiCommunicator::Op op) : comm_(comm), op_(std::move(op)) {}
  ~MpiRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      std::cerr << "deepen: unfinished MPI request failed in its destructor: " << e.what() << "\n";
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;  // an error is reported once; the op is then complete or abandoned
    comm_->wait(op_);
  }
  bool test() override {
    if (done_) return true;
    try {
      done_ = comm_->test(op_);
    } catch (...) {
      done_ = true;
      throw;
    }
    return done_;
  }

 private:
  MpiCommunicator* comm_;
  MpiCommunicator::Op op_;
  bool done_ = false;
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int64_t max_message_bytes, std::shared_ptr<AbortState> state)
    : comm_(comm), max_message_bytes_(max_message_bytes), state_(std::move(state)) {
  if (max_message_bytes_ < 1 || max_message_bytes_ > (int64_t{1} << 30))
    throw std::invalid_argument("MpiCommunicator: max_message_bytes must be in 1..2^30");
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  // An aborted communicator may have operations its peers never matched; freeing it could block or
  // touch parked buffers, and the process is ending anyway.
  if (!state_->aborted() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::abort() { state_->abort(); }
void MpiCommunicator::set_activity(std::shared_ptr<control::TrainerActivity> activity) { state_->set_activity(activity); }
bool MpiCommunicator::aborted() const { return state_->aborted(); }

void MpiCommunicator::check_open(const std::string& what) {
  if (state_->aborted()) throw CommError("rank " + std::to_string(rank_) + ": " + what + ": communicator aborted");
}

void MpiCommunicator::abandon(Op& op) {
  for (size_t i = 0; i < op.requests.size(); ++i) {
    MPI_Request& r = op.requests[i];
    if (r == MPI_REQUEST_NULL) continue;
    // Only receives can be withdrawn: cancelling a send is deprecated and cancelling a
    // non-blocking collective is erroneous (Open MPI aborts the job).
    if (op.expected_bytes[i] >= 0) MPI_Cancel(&r);
    abandoned_requests_.push_back(r);
    r = MPI_REQUEST_NULL;
  }
  for (auto& t : op.keep) abandoned_tensors_.push_back(t);
  op.keep.clear();
}

bool MpiCommunicator::test(Op& op) {
  if (state_->aborted()) {
    abandon(op);
    throw CommError("rank " + std::to_string(rank_) + ": " + op.what + ": communicator aborted");
  }
  std::vector<MPI_Status> statuses(op.requests.size());
  int done = 0;
  const int rc = MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &done, statuses.data());
  if (rc != MPI_SUCCESS) {
    std::string detail = mpi_error(rc);
    if (rc == MPI_ERR_IN_STATUS)
      for (const auto& st : statuses)
        if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) detail = mpi_error(st.MPI_ERROR);
    abandon(op);
    throw CommError("rank " + std::to_string(rank_) + ": " + op.what + ": " + detail +
                    " (a message larger than the receive buffer means the ranks disagree on the shape)");
  }
  if (!done) return false;
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (op.expected_bytes[i] < 0) continue;
    int got = 0;
    MPI_Get_count(&statuses[i], MPI_BYTE, &got);
    if (got != op.expected_bytes[i])
      throw CommError("rank " + std::to_string(rank_) + ": " + op.what + ": piece " + std::to_string(i) +
                      " carried " + std::to_string(got) + " bytes, expected " +
                      std::to_string(op.expected_bytes[i]) + " (the ranks disagree on the shape)");
  }
  op.keep.clear();
  if (op.finish) {
    auto finish = std::move(op.finish);
    op.finish = nullptr;
    finish();
  }
  return true;
}

void MpiCommunicator::wait(Op& op) {
  if (test(op)) return;
  // A wait on other ranks: the watchdog counts this rank as waiting, not computing, meanwhile.
  const control::TrainerActivity::Wait marked(state_->activity(), op.what);
  WaitBackoff backoff;
  while (!test(op)) backoff.pause();
}

void MpiCommunicator::post_send(Op& op, const at::Tensor& tensor, int dst, int tag) {
  check_cpu_tensor(tensor, "send");
  check_peer(dst, size_, tag, "send");
  auto* base = static_cast<char*>(tensor.data_ptr());
  for (auto [off, len] : pieces(tensor.nbytes(), max_message_bytes_)) {
    MPI_Request r;
    check_mpi(MPI_Isend(base + off, static_cast<int>(len), MPI_BYTE, dst, tag, comm_, &r), "MPI_Isend");
    op.requests.push_back(r);
    op.expected_bytes.push_back(-1);
  }
  op.keep.push_back(tensor);
}

void MpiCommunicator::post_recv(Op& op, const at::Tensor& out, int src, int tag) {
  check_cpu_tensor(out, "recv");
  check_peer(src, size_, tag, "recv");
  auto* base = static_cast<char*>(out.data_ptr());
  for (auto [off, len] : pieces(out.nbytes(), max_message_bytes_)) {
    MPI_Request r;
    check_mpi(MPI_Irecv(base + off, static_cast<int>(len), MPI_BYTE, src, tag, comm_, &r), "MPI_Irecv");
    op.requests.push_back(r);
    op.expected_bytes.push_back(len);
  }
  op.keep.push_back(out);
}

void MpiCommunicator::send(const at::Tensor& tensor, int dst, int tag) { isend(tensor, dst, tag)->wait(); }

void MpiCommunicator::recv(const at::Tensor& out, int src, int tag) { irecv(out, src, tag)->wait(); }

std::unique_ptr<Request> MpiCommunicator::isend(const at::Tensor& tensor, int dst, int tag) {
  return batch_isend_irecv({P2POp{P2POp::kSend, tensor, dst, tag}});
}

std::unique_ptr<Request> MpiCommunicator::irecv(const at::Tensor& out, int src, int tag) {
  return batch_isend_irecv({P2POp{P2POp::kRecv, out, src, tag}});
}

std::unique_ptr<Request> MpiCommunicator::batch_isend_irecv(const std::vector<P2POp>& ops) {
  Op op;
  for (const P2POp& p : ops) {
    const bool is_send = p.kind == P2POp::kSend;
    op.what += std::string(op.what.empty() ? "" : ", ") + (is_send ? "send to" : "recv from") + " rank " +
               std::to_string(p.peer) + " tag " + std::to_string(p.tag) + " (" +
               std::to_string(p.tensor.defined() ? p.tensor.nbytes() : 0) + " bytes)";
  }
  check_open(op.what);
  // Validate everything before posting anything: half a batch must never be left posted.
  for (const P2POp& p : ops) {
    check_cpu_tensor(p.tensor, p.kind == P2POp::kSend ? "send" : "recv");
    check_peer(p.peer, size_, p.tag, p.kind == P2POp::kSend ? "send" : "recv");
  }
  try {
    for (const P2POp& p : ops) {
      if (p.kind == P2POp::kSend) post_send(op, p.tensor, p.peer, p.tag);
      else post_recv(op, p.tensor, p.peer, p.tag);
    }
  } catch (...) {
    abandon(op);  // an MPI error while posting: the communicator is unusable anyway
    throw;
  }
  return std::make_unique<MpiRequest>(this, std::move(op));
}

void MpiCommunicator::broadcast(const at::Tensor& tensor, int root) {
  check_cpu_tensor(tensor, "broadcast");
  check_peer(root, size_, 0, "broadcast");
  Op op;
  op.what = "broadcast from rank " + std::to_string(root) + " (" + std::to_string(tensor.nbytes()) + " bytes)";
  check_open(op.what);
  auto* base = static_cast<char*>(tensor.data_ptr());
  for (auto [off, len] : pieces(tensor.nbytes(), max_message_bytes_)) {
    MPI_Request r;
    check_mpi(MPI_Ibcast(base + off, static_cast<int>(len), MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
    op.requests.push_back(r);
    op.expected_bytes.push_back(-1);
  }
  op.keep.push_back(tensor);
  wait(op);
}

MpiCommunicator::Op MpiCommunicator::post_reduce(const at::Tensor& work, const std::string& what) {
  const MPI_Datatype type = reduce_type(work.scalar_type());
  Op op;
  op.what = what + " (" + std::to_string(work.numel()) + " elements)";
  check_open(op.what);
  const int64_t elem = work.element_size();
  auto* base = static_cast<char*>(work.data_ptr());
  const int64_t max_elems = std::max<int64_t>(1, max_message_bytes_ / elem);
  for (auto [off, len] : pieces(work.numel(), max_elems)) {
    MPI_Request r;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, base + off * elem, static_cast<int>(len), type, MPI_SUM, comm_, &r),
              "MPI_Iallreduce");
    op.requests.push_back(r);
    op.expected_bytes.push_back(-1);
  }
  op.keep.push_back(work);
  return op;
}

void MpiCommunicator::reduce_in_place(const at::Tensor& tensor, const std::string& what) {
  check_cpu_tensor(tensor, "all_reduce");
  const bool staged = reduce_type(tensor.scalar_type()) == MPI_DATATYPE_NULL;
  if (staged && !at::isFloatingType(tensor.scalar_type()))
    throw std::invalid_argument("MpiCommunicator::all_reduce: unsupported dtype " +
                                std::string(c10::toString(tensor.scalar_type())));
  // bf16/fp16: sum in fp32 and round once at the end (same result on every rank).
  const at::Tensor work = staged ? tensor.to(at::kFloat) : tensor;
  Op op = post_reduce(work, what);
  wait(op);
  if (staged) tensor.copy_(work);
}

void MpiCommunicator::all_reduce_sum(const at::Tensor& tensor) { reduce_in_place(tensor, "all_reduce_sum"); }

void MpiCommunicator::all_reduce_avg(const at::Tensor& tensor) { iall_reduce_avg(tensor)->wait(); }

std::unique_ptr<Request> MpiCommunicator::iall_reduce_avg(const at::Tensor& tensor) {
  check_cpu_tensor(tensor, "all_reduce_avg");
  if (!at::isFloatingType(tensor.scalar_type()))
    throw std::invalid_argument("MpiCommunicator::all_reduce_avg: needs a floating dtype");
  // bf16/fp16: sum in fp32 and divide before rounding, so the average is rounded once.
  const bool staged = reduce_type(tensor.scalar_type()) == MPI_DATATYPE_NULL;
  const at::Tensor work = staged ? tensor.to(at::kFloat) : tensor;
  Op op = post_reduce(work, "all_reduce_avg");
  const int size = size_;
  op.finish = [tensor, work, staged, size] {
    work.div_(size);
    if (staged) tensor.copy_(work);
  };
  return std::make_unique<MpiRequest>(this, std::move(op));
}

// One MPI_Ireduce_scatter_block when a rank's chunk fits in one message; otherwise piece by piece,
// each piece packing the same slice of every rank's chunk together (the layout the call expects).
std::unique_ptr<Request> MpiCommunicator::ireduce_scatter_avg(const at::Tensor& input, const at::Tensor& output) {
  check_cpu_tensor(input, "reduce_scatter_avg");
  check_cpu_tensor(output, "reduce_scatter_avg");
  if (!at::isFloatingType(output.scalar_type()) || input.scalar_type() != output.scalar_type())
    throw std::invalid_argument("MpiCommunicator::reduce_scatter_avg: needs input and output of one floating dtype");
  const int64_t n = output.numel();
  if (input.numel() != n * size_)
    throw std::invalid_argument("MpiCommunicator::reduce_scatter_avg: input has " + std::to_string(input.numel()) +
                                " elements, expected " + std::to_string(size_) + " x " + std::to_string(n));
  const bool staged = reduce_type(output.scalar_type()) == MPI_DATATYPE_NULL;
  const at::Tensor in = staged ? input.to(at::kFloat) : input;
  const at::Tensor out = staged ? at::empty({n}, at::kFloat) : output.view({n});
  const MPI_Datatype type = reduce_type(in.scalar_type());
  Op op;
  op.what = "reduce_scatter_avg (" + std::to_string(n) + " elements per rank)";
  check_open(op.what);
  const int64_t elem = in.element_size();
  const int64_t max_elems = std::max<int64_t>(1, max_message_bytes_ / elem);
  const at::Tensor chunks = in.view({size_, n});
  for (auto [off, len] : pieces(n, max_elems)) {
    const at::Tensor send = len == n ? in : chunks.narrow(1, off, len).contiguous();
    MPI_Request r;
    check_mpi(MPI_Ireduce_scatter_block(send.data_ptr(), static_cast<char*>(out.data_ptr()) + off * elem,
                                        static_cast<int>(len), type, MPI_SUM, comm_, &r),
              "MPI_Ireduce_scatter_block");
    op.requests.push_back(r);
    op.expected_bytes.push_back(-1);
    op.keep.push_back(send);
  }
  op.keep.push_back(out);
  const int size = size_;
  op.finish = [output, out, staged, size] {
    out.div_(size);
    if (staged) output.view({-1}).copy_(out);
  };
  return std::make_unique<MpiRequest>(this, std::move(op));
}

// Bytes, so every dtype is gathered exactly. A rank's input larger than one message goes piece by
// piece into a packed buffer per piece, unpacked into `output` when all have arrived.
std::unique_ptr<Request> MpiCommunicator::iall_gather_into(const at::Tensor& input, const at::Tensor& output) {
  check_cpu_tensor(input, "all_gather_into");
  check_cpu_tensor(output, "all_gather_into");
  if (input.scalar_type() != output.scalar_type() || output.numel() != input.numel() * size_)
    throw std::invalid_argument("MpiCommunicator::all_gather_into: output must hold " + std::to_string(size_) +
                                " x " + std::to_string(input.numel()) + " elements of the input's dtype");
  const int64_t bytes = static_cast<int64_t>(input.nbytes());
  Op op;
  op.what = "all_gather_into (" + std::to_string(bytes) + " bytes per rank)";
  check_open(op.what);
  const auto ranges = pieces(bytes, max_message_bytes_);
  std::vector<at::Tensor> packed;
  for (auto [off, len] : ranges) {
    const bool whole = len == bytes;
    at::Tensor recv = whole ? output : at::empty({size_ * len}, at::kByte);
    MPI_Request r;
    check_mpi(MPI_Iallgather(static_cast<const char*>(input.data_ptr()) + off, static_cast<int>(len), MPI_BYTE,
                             recv.data_ptr(), static_cast<int>(len), MPI_BYTE, comm_, &r),
              "MPI_Iallgather");
    op.requests.push_back(r);
    op.expected_bytes.push_back(-1);
    op.keep.push_back(recv);
    if (!whole) packed.push_back(recv);
  }
  op.keep.push_back(input);
  op.keep.push_back(output);
  if (!packed.empty()) {
    const int size = size_;
    op.finish = [output, packed, ranges, size, bytes] {
      const at::Tensor dst = output.view(at::kByte).view({size, bytes});
      for (size_t i = 0; i < ranges.size(); ++i)
        dst.narrow(1, ranges[i].first, ranges[i].second).copy_(packed[i].view({size, ranges[i].second}));
    };
  }
  return std::make_unique<MpiRequest>(this, std::move(op));
}

template <class T>
std::vector<T> MpiCommunicator::all_gather_value(T value, MPI_Datatype type, const char* what) {
  std::vector<T> out(size_);
  Op op;
  op.what = what;
  check_open(op.what);
  MPI_Request r;
  check_mpi(MPI_Iallgather(&value, 1, type, out.data(), 1, type, comm_, &r), "MPI_Iallgather");
  op.requests.push_back(r);
  op.expected_bytes.push_back(-1);
  wait(op);
  return out;
}

std::vector<int64_t> MpiCommunicator::all_gather(int64_t value) {
  return all_gather_value(value, MPI_INT64_T, "all_gather(int64)");
}

std::vector<uint64_t> MpiCommunicator::all_gather(uint64_t value) {
  return all_gather_value(value, MPI_UINT64_T, "all_gather(uint64)");
}

void MpiCommunicator::barrier() {
  Op op;
  op.what = "barrier";
  check_open(op.what);
  MPI_Request r;
  check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  op.requests.push_back(r);
  op.expected_bytes.push_back(-1);
  wait(op);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split_mpi(int color, int key) {
  check_open("split");
  MPI_Comm child = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), "MPI_Comm_split");
  if (child == MPI_COMM_NULL) return nullptr;
  auto state = std::make_shared<AbortState>();
  state_->adopt(state);
  return std::make_unique<MpiCommunicator>(child, max_message_bytes_, std::move(state));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) { return split_mpi(color, key); }

std::vector<std::string> MpiCommunicator::all_gather_strings(const std::string& value) {
  check_open("all_gather_strings");
  int len = static_cast<int>(value.size());
  std::vector<int> lens(size_), offsets(size_);
  check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_), "MPI_Allgather");
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[r] = total;
    total += lens[r];
  }
  std::string all(total, '\0');
  check_mpi(MPI_Allgatherv(value.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, comm_),
            "MPI_Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(offsets[r], lens[r]));
  return out;
}

void MpiCommunicator::broadcast_bytes(void* data, int64_t bytes, int root) {
  check_open("broadcast_bytes");
  if (bytes > max_message_bytes_) throw std::invalid_argument("MpiCommunicator::broadcast_bytes: too large");
  check_mpi(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_), "MPI_Bcast");
}

std::unique_ptr<Communicator> make_mpi_communicator(const MpiSession& mpi, int64_t max_message_bytes) {
  (void)mpi;  // proof that MPI is initialized: the session owns its lifetime
  MPI_Comm world = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(world, max_message_bytes, std::make_shared<AbortState>());
}

}  // namespace deepen
