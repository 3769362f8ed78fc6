// Logit channel: header + payload per micro-batch, full or top-k, with desync detection.
#include "dist/logit_channel.h"

#include <ATen/ATen.h>

#include "dist/communicator.h"

namespace deepen {
namespace {

constexpr int64_t kMagic = 0x4450'4e4c'4f47'0001;  // "DPNLOG" v1
constexpr int kTagHeader = 11;
constexpr int kTagPayload = 12;
constexpr int kTagIndices = 13;
enum Payload : int64_t { kFullF32 = 0, kFullBF16 = 1, kTopk = 2 };

}  // namespace

std::string ChannelFormat::describe() const {
  if (!topk) return bf16_values ? "full:bf16" : "full";
  return "topk:" + std::to_string(k) + ":" + (tail == TopkTail::kBucket ? "bucket" : "renormalize");
}

ChannelFormat channel_format(const DistillConfig& d) {
  ChannelFormat f;
  f.topk = d.logits == "topk";
  f.k = d.topk;
  f.bf16_values = d.channel_dtype == FloatDtype::kBf16;
  f.tail = distill_loss_options(d).tail;
  f.temperature = d.temperature;
  f.vocab_chunk = d.vocab_chunk;
  return f;
}

struct LogitChannelSender::InFlight {
  at::Tensor header, payload, indices;
  std::unique_ptr<Request> header_req, payload_req, indices_req;
  // On the host: NCCL's stream-ordered wait would not bound the queue (see wait_on_host).
  void wait() {
    wait_on_host(*header_req);
    wait_on_host(*payload_req);
    if (indices_req) wait_on_host(*indices_req);
  }
};

LogitChannelSender::LogitChannelSender(Communicator& channel, ChannelFormat format, int first_student,
                                       int64_t max_in_flight)
    : channel_(channel), format_(format), first_student_(first_student), max_in_flight_(max_in_flight) {}

LogitChannelSender::~LogitChannelSender() {
  try {
    flush();
  } catch (...) {
    // Destruction during an error: the peers are gone or aborted; nothing to deliver.
  }
}

void LogitChannelSender::send(const BatchKey& key, uint64_t checksum, const at::Tensor& logits) {
  while (static_cast<int64_t>(in_flight_.size()) >= max_in_flight_) {
    in_flight_.front()->wait();
    in_flight_.pop_front();
  }
  const int dst = 1 + static_cast<int>(key.student) - first_student_;
  const at::Device wire = channel_.device();
  const at::Tensor rows = logits.reshape({-1, logits.size(-1)});
  auto msg = std::make_unique<InFlight>();
  Payload payload;
  if (format_.topk && key.kind == BatchKind::kTrain) {
    const TeacherTargets t = teacher_topk(rows, format_.k, format_.temperature, format_.vocab_chunk);
    msg->payload = t.values.to(wire, at::kFloat).contiguous();
    msg->indices = t.indices.to(wire, at::kInt).contiguous();
    payload = kTopk;
  } else if (format_.bf16_values && key.kind == BatchKind::kTrain) {
    msg->payload = rows.to(wire, at::kBFloat16).contiguous();
    payload = kFullBF16;
  } else {
    msg->payload = rows.to(wire, at::kFloat).contiguous();
    payload = kFullF32;
  }
  msg->header = at::tensor(std::vector<int64_t>{kMagic, static_cast<int64_t>(key.kind), key.step, key.student,
                                                key.index, static_cast<int64_t>(checksum), rows.size(0),
                                                static_cast<int64_t>(payload)},
                           at::kLong)
                    .to(wire);
  msg->header_req = channel_.isend(msg->header, dst, kTagHeader);
  msg->payload_req = channel_.isend(msg->payload, dst, kTagPayload);
  if (msg->indices.defined()) msg->indices_req = channel_.isend(msg->indices, dst, kTagIndices);
  bytes_ += static_cast<int64_t>(msg->header.nbytes() + msg->payload.nbytes() +
                                 (msg->indices.defined() ? msg->indices.nbytes() : 0));
  in_flight_.push_back(std::move(msg));
}

void LogitChannelSender::flush() {
  while (!in_flight_.empty()) {
    in_flight_.front()->wait();
    in_flight_.pop_front();
  }
}

ChannelTeacherSource::ChannelTeacherSource(Communicator& channel, ChannelFormat format, int64_t vocab,
                                           int teacher_world_rank, int student_world_rank, at::Device device)
    : channel_(channel),
      format_(format),
      vocab_(vocab),
      teacher_rank_(teacher_world_rank),
      student_rank_(student_world_rank),
      device_(device) {}

at::Tensor ChannelTeacherSource::reusable(at::Tensor& slot, at::IntArrayRef shape, at::ScalarType dtype) {
  // use_count() == 1: only this slot still refers to the buffer, so nobody reads it any more.
  if (!slot.defined() || slot.use_count() > 1 || slot.sizes() != shape || slot.scalar_type() != dtype)
    slot = at::empty(shape, at::TensorOptions().dtype(dtype).device(channel_.device()));
  return slot;
}

TeacherTargets ChannelTeacherSource::targets(const MicroBatch& batch) {
  const at::Tensor wire_header = at::empty({kHeaderWords}, at::TensorOptions().dtype(at::kLong).device(channel_.device()));
  channel_.recv(wire_header, 0, kTagHeader);
  const at::Tensor header = wire_header.to(at::kCPU);  // the host reads it (a no-op for MPI)
  const int64_t* h = header.data_ptr<int64_t>();
  const BatchKey mine{batch.kind, batch.step, batch.student, batch.index};
  const BatchKey theirs{static_cast<BatchKind>(h[1]), h[2], h[3], h[4]};
  const int64_t rows = batch.inputs.numel();
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
  bytes_ += static_cast<int64_t>(header.nbytes());
  switch (static_cast<Payload>(h[7])) {
    case kFullF32:
    case kFullBF16: {
      at::Tensor logits = reusable(full_, {rows, vocab_}, h[7] == kFullF32 ? at::kFloat : at::kBFloat16);
      channel_.recv(logits, 0, kTagPayload);
      bytes_ += static_cast<int64_t>(logits.nbytes());
      return TeacherTargets::full(logits.to(device_));
    }
    case kTopk: {
      at::Tensor values = reusable(values_, {rows, format_.k}, at::kFloat);
      at::Tensor indices = reusable(indices_, {rows, format_.k}, at::kInt);
      channel_.recv(values, 0, kTagPayload);
      channel_.recv(indices, 0, kTagIndices);
      bytes_ += static_cast<int64_t>(values.nbytes() + indices.nbytes());
      return TeacherTargets::topk(values.to(device_), indices.to(device_));
    }
  }
  throw CommError("logit channel: unknown payload " + std::to_string(h[7]) + " from teacher rank " +
                  std::to_string(teacher_rank_));
}

}  // namespace deepen
