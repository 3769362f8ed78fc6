// Logit channel: header + payload per micro-batch, full or top-k, with desync detection.
#include "dist/logit_channel.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include <ATen/ATen.h>

#include "dist/communicator.h"

namespace deepen {
namespace {

constexpr int64_t kMagic = 0x4450'4e4c'4f47'0001;  // "DPNLOG" v1
constexpr int kTagHeader = 11;
constexpr int kTagPayload = 12;
constexpr int kTagIndices = 13;
enum Payload : int64_t { kFullF32 = 0, kFullBF16 = 1, kTopk = 2, kHiddenF32 = 3, kHiddenBF16 = 4 };

// What a batch of `kind` travels as: train batches as the format says, eval batches exact (full
// logits, or hidden states on a hidden channel, in the teacher's own dtype).
Payload payload_for(const ChannelFormat& f, BatchKind kind) {
  const bool train = kind == BatchKind::kTrain;
  const bool bf16 = train ? f.bf16_values : f.teacher_bf16;
  if (f.hidden) return bf16 ? kHiddenBF16 : kHiddenF32;
  if (train && f.topk) return kTopk;
  return bf16 ? kFullBF16 : kFullF32;
}

const char* payload_name(int64_t p) {
  switch (p) {
    case kFullF32: return "full fp32 logits";
    case kFullBF16: return "full bf16 logits";
    case kTopk: return "top-k";
    case kHiddenF32: return "fp32 hidden states";
    case kHiddenBF16: return "bf16 hidden states";
  }
  return "an unknown payload";
}

// Receive buffers a student keeps for reuse: the current and the prefetched micro-batch's, for
// train and eval shapes (top-k needs two per micro-batch).
constexpr size_t kMaxPooled = 4;

}  // namespace

std::string ChannelFormat::describe() const {
  if (hidden) return bf16_values ? "hidden:bf16" : "hidden";
  if (!topk) return bf16_values ? "full:bf16" : "full";
  return "topk:" + std::to_string(k) + ":" + option_name(tail);
}

ChannelFormat channel_format(const DistillConfig& d, FloatDtype teacher_dtype) {
  ChannelFormat f;
  f.teacher_bf16 = teacher_dtype == FloatDtype::kBf16;
  f.topk = d.logits == TeacherOutput::kTopk;
  f.hidden = d.logits == TeacherOutput::kHidden;
  f.k = d.topk;
  f.bf16_values = d.channel_dtype == FloatDtype::kBf16;
  f.tail = d.tail;
  f.temperature = d.temperature;
  f.vocab_chunk = d.vocab_chunk;
  return f;
}

struct LogitChannelSender::InFlight {
  at::Tensor header, payload, indices;  // payload and indices shared with the item's other receivers
  std::unique_ptr<Request> header_req, payload_req, indices_req;
  // On the host: NCCL's stream-ordered wait would not bound the queue (see wait_on_host).
  void wait() {
    wait_on_host(*header_req);
    wait_on_host(*payload_req);
    if (indices_req) wait_on_host(*indices_req);
  }
};

LogitChannelSender::LogitChannelSender(Communicator& channel, ChannelFormat format, int first_student,
                                       int64_t max_in_flight, int runs, int students_per_pipeline)
    : channel_(channel),
      format_(format),
      first_student_(first_student),
      max_in_flight_(max_in_flight),
      students_per_pipeline_(students_per_pipeline),
      in_flight_(static_cast<size_t>(runs)) {}

LogitChannelSender::~LogitChannelSender() {
  try {
    flush();
  } catch (...) {
    // Destruction during an error: the peers are gone or aborted; nothing to deliver.
  }
}

void LogitChannelSender::send(const std::vector<Delivery>& to, uint64_t checksum, const at::Tensor& output) {
  if (to.empty()) return;
  const at::Device wire = channel_.device();
  const at::Tensor rows = output.reshape({-1, output.size(-1)});
  const Payload payload = payload_for(format_, to.front().key.kind);
  make_room(to, false);
  if (payload == kTopk) {
    const TeacherTargets t = teacher_topk(rows, format_.k, format_.temperature, format_.vocab_chunk);
    post(to, checksum, rows.size(0), payload, t.values.to(wire, at::kFloat).contiguous(),
         t.indices.to(wire, at::kInt).contiguous());
  } else {
    // Full logits or hidden states: the rows as they are, in the wire dtype.
    const bool bf16 = payload == kFullBF16 || payload == kHiddenBF16;
    post(to, checksum, rows.size(0), payload, rows.to(wire, bf16 ? at::kBFloat16 : at::kFloat).contiguous(), {});
  }
}

std::optional<at::ScalarType> LogitChannelSender::full_logits_dtype(BatchKind kind) const {
  switch (payload_for(format_, kind)) {
    case kFullF32: return at::kFloat;
    case kFullBF16: return at::kBFloat16;
    default: return std::nullopt;
  }
}

at::Tensor LogitChannelSender::logits_buffer(const std::vector<Delivery>& to, int64_t rows, int64_t vocab) {
  const std::optional<at::ScalarType> dtype = to.empty() ? std::nullopt : full_logits_dtype(to.front().key.kind);
  if (!dtype) throw std::logic_error("LogitChannelSender::logits_buffer: this item's payload is not full logits");
  make_room(to, true);
  at::Tensor buffer = std::move(spare_);
  spare_ = at::Tensor();
  if (buffer.defined() && buffer.size(0) == rows && buffer.size(1) == vocab && buffer.scalar_type() == *dtype)
    return buffer;
  buffer = at::Tensor();  // freed before the new one exists
  return at::empty({rows, vocab}, at::TensorOptions().dtype(*dtype).device(channel_.device()));
}

void LogitChannelSender::send_logits(const std::vector<Delivery>& to, uint64_t checksum, at::Tensor logits) {
  if (to.empty()) return;
  const std::optional<at::ScalarType> dtype = full_logits_dtype(to.front().key.kind);
  if (!dtype || logits.dim() != 2 || logits.scalar_type() != *dtype || logits.device() != channel_.device())
    throw std::logic_error("LogitChannelSender::send_logits: not a buffer from logits_buffer() for " +
                           to.front().key.describe());
  make_room(to, true);  // a no-op after logits_buffer(to, ...)
  post(to, checksum, logits.size(0), payload_for(format_, to.front().key.kind), logits, {});
}

void LogitChannelSender::make_room(const std::vector<Delivery>& to, bool keep_spare) {
  if (!keep_spare) spare_ = at::Tensor();
  for (const Delivery& d : to) wait_for_room(d.run, keep_spare);
}

void LogitChannelSender::wait_for_room(int run, bool keep_spare) {
  auto& queue = in_flight_.at(static_cast<size_t>(run));
  while (static_cast<int64_t>(queue.size()) >= max_in_flight_) {
    queue.front()->wait();
    at::Tensor payload = std::move(queue.front()->payload);
    const bool full = !queue.front()->indices.defined();
    queue.pop_front();  // its requests go first: an MPI request may hold the payload too
    // One spare at most: a payload no other run's message still sends (logits_buffer() takes it
    // only if its shape and dtype are the ones asked for).
    if (keep_spare && full && payload.use_count() == 1) spare_ = std::move(payload);
  }
}

void LogitChannelSender::post(const std::vector<Delivery>& to, uint64_t checksum, int64_t rows, int64_t payload,
                              const at::Tensor& values, const at::Tensor& indices) {
  const at::Device wire = channel_.device();
  for (const Delivery& d : to) {
    wait_for_room(d.run, false);  // a no-op after make_room(to), unless `to` names a run twice
    const int dst = 1 + d.run * students_per_pipeline_ + static_cast<int>(d.key.student) - first_student_;
    auto msg = std::make_unique<InFlight>();
    msg->payload = values;
    msg->indices = indices;
    msg->header = at::tensor(std::vector<int64_t>{kMagic, static_cast<int64_t>(d.key.kind), d.key.step, d.key.student,
                                                  d.key.index, static_cast<int64_t>(checksum), rows, payload},
                             at::kLong)
                      .to(wire);
    msg->header_req = channel_.isend(msg->header, dst, kTagHeader);
    msg->payload_req = channel_.isend(msg->payload, dst, kTagPayload);
    if (msg->indices.defined()) msg->indices_req = channel_.isend(msg->indices, dst, kTagIndices);
    bytes_ += static_cast<int64_t>(msg->header.nbytes() + msg->payload.nbytes() +
                                   (msg->indices.defined() ? msg->indices.nbytes() : 0));
    in_flight_.at(static_cast<size_t>(d.run)).push_back(std::move(msg));
  }
  note_held();
}

void LogitChannelSender::note_held() {
  std::set<const void*> seen;  // a payload several runs' messages send is held once
  int64_t held = 0;
  auto count = [&](const at::Tensor& t) {
    if (t.defined() && seen.insert(t.storage().data()).second) held += static_cast<int64_t>(t.nbytes());
  };
  for (const auto& queue : in_flight_)
    for (const auto& msg : queue) {
      count(msg->payload);
      count(msg->indices);
    }
  count(spare_);
  peak_held_ = std::max(peak_held_, held);
}

void LogitChannelSender::flush() {
  for (auto& queue : in_flight_) {
    while (!queue.empty()) {
      queue.front()->wait();
      queue.pop_front();
    }
  }
  spare_ = at::Tensor();
}

struct ChannelTeacherSource::Posted {
  BatchKey key;
  int64_t rows = 0;
  Payload payload = kFullF32;
  at::Tensor header, values, indices;
  std::unique_ptr<Request> header_req, values_req, indices_req;
};

ChannelTeacherSource::ChannelTeacherSource(Communicator& channel, ChannelFormat format, int64_t vocab,
                                           int teacher_world_rank, int student_world_rank, at::Device device,
                                           at::Tensor teacher_head)
    : channel_(channel),
      format_(format),
      vocab_(vocab),
      teacher_rank_(teacher_world_rank),
      student_rank_(student_world_rank),
      device_(device),
      head_(std::move(teacher_head)) {
  if (format_.hidden && (!head_.defined() || head_.dim() != 2 || head_.size(0) != vocab_))
    throw std::invalid_argument("ChannelTeacherSource: a hidden-state channel needs the teacher's head [" +
                                std::to_string(vocab_) + ", H]");
}

namespace {

// A receive posted ahead whose message may never come (the job is failing: a desync, or an error
// unwound the trainer between prefetch and targets) must not block: a Request waits in its
// destructor. Leaking it keeps its buffer referenced (the request holds it), so a late message
// still lands in live memory; the process is ending, and on the normal path nothing is abandoned.
template <class P>
void abandon(P& p) {
  (void)p.header_req.release();
  (void)p.values_req.release();
  (void)p.indices_req.release();
}

}  // namespace

ChannelTeacherSource::~ChannelTeacherSource() {
  for (auto& p : posted_) abandon(*p);
}

at::Tensor ChannelTeacherSource::reusable(at::IntArrayRef shape, at::ScalarType dtype) {
  // use_count() == 1: only the pool still refers to the buffer, so nobody reads it any more.
  for (at::Tensor& t : pool_)
    if (t.use_count() == 1 && t.sizes() == shape && t.scalar_type() == dtype) return t;
  at::Tensor fresh = at::empty(shape, at::TensorOptions().dtype(dtype).device(channel_.device()));
  if (pool_.size() < kMaxPooled) {
    pool_.push_back(fresh);
  } else {
    // Shapes changed (documents mode: each micro-batch as long as its longest document): replace
    // a free buffer rather than growing the pool.
    for (at::Tensor& t : pool_)
      if (t.use_count() == 1) {
        t = fresh;
        break;
      }
  }
  return fresh;
}

std::unique_ptr<ChannelTeacherSource::Posted> ChannelTeacherSource::post(const MicroBatch& batch) {
  auto p = std::make_unique<Posted>();
  p->key = BatchKey{batch.kind, batch.step, batch.student, batch.index};
  p->rows = batch.inputs.numel();
  p->payload = payload_for(format_, batch.kind);
  p->header = at::empty({kHeaderWords}, at::TensorOptions().dtype(at::kLong).device(channel_.device()));
  switch (p->payload) {
    case kFullF32:
    case kFullBF16:
      p->values = reusable({p->rows, vocab_}, p->payload == kFullF32 ? at::kFloat : at::kBFloat16);
      break;
    case kHiddenF32:
    case kHiddenBF16:
      p->values = reusable({p->rows, head_.size(1)}, p->payload == kHiddenF32 ? at::kFloat : at::kBFloat16);
      break;
    case kTopk:
      p->values = reusable({p->rows, format_.k}, at::kFloat);
      p->indices = reusable({p->rows, format_.k}, at::kInt);
      break;
  }
  p->header_req = channel_.irecv(p->header, 0, kTagHeader);
  p->values_req = channel_.irecv(p->values, 0, kTagPayload);
  if (p->indices.defined()) p->indices_req = channel_.irecv(p->indices, 0, kTagIndices);
  return p;
}

void ChannelTeacherSource::prefetch(const MicroBatch& next) { posted_.push_back(post(next)); }

TeacherTargets ChannelTeacherSource::targets(const MicroBatch& batch) {
  const BatchKey mine{batch.kind, batch.step, batch.student, batch.index};
  if (posted_.empty()) posted_.push_back(post(batch));
  std::unique_ptr<Posted> p = std::move(posted_.front());
  posted_.pop_front();
  if (p->key != mine) {
    abandon(*p);
    throw std::logic_error("logit channel: the trainer prefetched " + p->key.describe() + " but asks for " +
                           mine.describe());
  }
  p->header_req->wait();
  const at::Tensor header = p->header.to(at::kCPU);  // the host reads it (a no-op for MPI)
  const int64_t* h = header.data_ptr<int64_t>();
  const BatchKey theirs{static_cast<BatchKind>(h[1]), h[2], h[3], h[4]};
  const int64_t rows = batch.inputs.numel();
  if (h[0] != kMagic || static_cast<uint64_t>(h[5]) != batch.checksum || theirs != mine || h[6] != rows ||
      h[7] != p->payload)
    abandon(*p);  // the payload receive may not match what comes: do not wait for it below
  if (h[0] != kMagic)
    throw CommError("logit channel: rank " + std::to_string(student_rank_) + " got a corrupt header from teacher rank " +
                    std::to_string(teacher_rank_) + " while waiting for " + mine.describe());
  if (static_cast<uint64_t>(h[5]) != batch.checksum || theirs.kind != mine.kind || theirs.step != mine.step ||
      theirs.student != mine.student || theirs.index != mine.index || h[6] != rows)
    throw CommError("desync at step " + std::to_string(batch.step) + ": student rank " +
                    std::to_string(student_rank_) + " is on " + mine.describe() + " (ids checksum " +
                    std::to_string(batch.checksum) + ") but teacher rank " + std::to_string(teacher_rank_) +
                    " sent targets for " + theirs.describe() + " (ids checksum " +
                    std::to_string(static_cast<uint64_t>(h[5])) + "): the two sides read different batches");
  if (h[7] != p->payload)
    throw CommError("logit channel: teacher rank " + std::to_string(teacher_rank_) + " sent " + payload_name(h[7]) +
                    " for " + mine.describe() + " but student rank " + std::to_string(student_rank_) + " expects " +
                    payload_name(p->payload) + " (" + format_.describe() +
                    "): the two sides disagree on distill.logits or distill.channel_dtype");
  p->values_req->wait();
  if (p->indices_req) p->indices_req->wait();
  bytes_ += static_cast<int64_t>(header.nbytes() + p->values.nbytes() + (p->indices.defined() ? p->indices.nbytes() : 0));
  switch (p->payload) {
    case kFullF32:
    case kFullBF16:
      return TeacherTargets::full(p->values.to(device_));
    case kHiddenF32:
    case kHiddenBF16:
      return TeacherTargets::from_hidden(p->values.to(device_), head_);
    case kTopk:
      return TeacherTargets::topk(p->values.to(device_), p->indices.to(device_));
  }
  throw std::logic_error("logit channel: unhandled payload");
}

}  // namespace deepen
