// LogitChannel: teacher targets from a pipeline's last stage to its students, one message pair per
// micro-batch (header + payload), with the ids checksum that catches a desync.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "config/config.h"
#include "dist/teacher_schedule.h"
#include "train/batch_order.h"
#include "train/teacher_source.h"

namespace deepen {

class Communicator;
class Request;

// Wire format of one micro-batch (channel rank 0 = the last teacher stage, rank 1 + j = the
// pipeline's j-th student):
//   header  int64[8] = {magic, kind, step, student, index, ids checksum, rows N, payload}
//   payload 0 "full fp32":  logits [N, V] fp32
//           1 "full bf16":  logits [N, V] bf16
//           2 "topk":       values [N, k] fp32 (log p_T^τ, see teacher_topk) then indices [N, k] int32
//           3 "hidden fp32": final normalised hidden states [N, H] fp32
//           4 "hidden bf16": the same in bf16
// So a top-k token costs k·(4 + 4) bytes, a hidden one 2·H (bf16; 8 KiB at H = 4096 against
// 297 KiB of bf16 logits at V = 151,936), plus the 64-byte header per micro-batch.
// Both messages live on the channel's device (Communicator::device(): CUDA for NCCL, which moves
// only device memory; CPU for MPI). The sender copies from the teacher's device to it, the
// receiver from it to the student's device; where the devices are equal these are no-ops.
// Train batches use distill.logits. Eval batches go exact: full logits in the teacher's own dtype
// (fp32, or bf16 for a bf16 teacher, whose logits are bf16 values: an fp32 copy would carry no more
// and take 9.96 GB instead of 4.98 at the paper's micro-batch), so validation KL is exact; with the
// hidden channel they go as hidden states in the teacher's dtype instead: the student makes the
// same fp32 logits from them with the same head (exact up to the order of the head matmul's sums,
// as for train batches), at 4·H bytes a token instead of 4·V (37x less at the paper's shapes).
struct ChannelFormat {
  bool topk = false;
  int64_t k = 0;
  bool hidden = false;       // hidden states instead of logits: the students hold the teacher's head
  bool bf16_values = false;  // train batches: full logits or hidden states in bf16 on the wire
  bool teacher_bf16 = false; // the teacher computes in bf16 (teacher.dtype): eval batches go in bf16
  TopkTail tail = TopkTail::kRenormalize;
  double temperature = 1.0;
  int64_t vocab_chunk = 8192;
  std::string describe() const;  // "full", "full:bf16", "topk:64:renormalize", "hidden:bf16"
};
// distill.* and teacher.dtype as the wire sees them (the job plan makes it once, launch/job_plan.h).
ChannelFormat channel_format(const DistillConfig& distill, FloatDtype teacher_dtype = FloatDtype::kFp32);

inline constexpr int kHeaderWords = 8;

// Teacher side. send() returns once the messages are queued; at most max_in_flight micro-batches
// are outstanding per run (that run's older ones are waited for first): back-pressure on a teacher
// that runs ahead of a run's students, and a bound on the teacher's memory of
// runs × max_in_flight payloads (fewer when runs share items: one payload serves every receiver).
// The channel's ranks: 0 the last stage, then for each run r the pipeline's students
// first_student .. first_student + students_per_pipeline - 1 (RankLayout::channel_rank).
//
// Full logits are written in place instead (dist/teacher_pipeline.cpp): full_logits_dtype(kind)
// says whether `kind`'s payload is full logits and in which dtype; logits_buffer() gives the
// payload tensor, which the last stage's head fills chunk by chunk (TeacherStage::head_into), and
// send_logits() posts it. logits_buffer() first waits until each receiving run has fewer than
// max_in_flight messages out, so the buffer being written counts as one of them, and the stage
// holds no other [rows, V] tensor: neither the head's output in the stage's dtype nor a cast of it
// for the wire (4.98 GB each in bf16 at the paper's micro-batch). A finished message's buffer that
// no other message still uses is kept (one) and reused for the next one of the same shape: a fresh
// 5 GB tensor costs a page fault per 4 KiB.
class LogitChannelSender {
 public:
  LogitChannelSender(Communicator& channel, ChannelFormat format, int first_student, int64_t max_in_flight,
                     int runs = 1, int students_per_pipeline = 1);
  ~LogitChannelSender();
  // The last stage's output for one micro-batch (ids checksum `checksum`), to every receiver in `to`:
  // logits [..., V], or with format.hidden the final normalised hidden states [..., H]. The payload
  // is made once; each receiver gets its own header (its key) and the same payload.
  void send(const std::vector<Delivery>& to, uint64_t checksum, const at::Tensor& output);
  // A lone run's micro-batch, to the student whose key it is.
  void send(const BatchKey& key, uint64_t checksum, const at::Tensor& output) { send({Delivery{0, key}}, checksum, output); }
  // The wire dtype of `kind`'s full logits; nullopt when its payload is not full logits (top-k
  // train batches, every batch of a hidden-state channel).
  std::optional<at::ScalarType> full_logits_dtype(BatchKind kind) const;
  // A [rows, vocab] tensor of full_logits_dtype(to's kind) on the channel's device, to fill and pass
  // to send_logits(): the spare buffer when it has that shape, else new.
  at::Tensor logits_buffer(const std::vector<Delivery>& to, int64_t rows, int64_t vocab);
  void send_logits(const std::vector<Delivery>& to, uint64_t checksum, at::Tensor logits);
  void flush();
  int64_t bytes_sent() const { return bytes_; }
  // The most bytes of distinct payload tensors the queues (and the spare buffer) held at once: the
  // memory this sender takes, at most runs × max_in_flight payloads.
  int64_t peak_held_bytes() const { return peak_held_; }

 private:
  struct InFlight;
  Communicator& channel_;
  ChannelFormat format_;
  int first_student_;
  int64_t max_in_flight_;
  int students_per_pipeline_;
  std::vector<std::deque<std::unique_ptr<InFlight>>> in_flight_;  // per run
  at::Tensor spare_;  // a finished message's full-logit buffer, for logits_buffer() to reuse
  // Waits until each run in `to` has fewer than max_in_flight messages out; a finished full-logit
  // payload nobody else holds becomes spare_ when keep_spare (else any spare is dropped).
  void make_room(const std::vector<Delivery>& to, bool keep_spare);
  void wait_for_room(int run, bool keep_spare);  // make_room for one run, the spare kept as asked
  void post(const std::vector<Delivery>& to, uint64_t checksum, int64_t rows, int64_t payload, const at::Tensor& values,
            const at::Tensor& indices);
  int64_t bytes_ = 0;
  int64_t peak_held_ = 0;
  void note_held();  // updates peak_held_ after a post
};

// Student side: the TeacherSource of a distributed run. Checks every header against the batch the
// student is about to train on and throws CommError naming the step and both ranks on a mismatch.
// Targets are returned on `device` (the student's). With format.hidden, `teacher_head` [V, H] is
// the teacher's LM head (load_teacher_head) on `device`: targets are the hidden states and it.
//
// Prefetch: prefetch(next) posts the receives of `next`'s header and payload at once (the student
// knows their sizes: its rows, and the payload kind its format gives the batch's kind), so the
// transfer runs while the student computes the current micro-batch; targets(next) then only waits.
// Receives are posted in consumption order (the trainer prefetches the item it will ask for next,
// batch_order.h's order), which is the order the teacher sends in: MPI matches equal tags in order,
// NCCL in issue order, so each posted receive gets its own micro-batch, and the header check still
// proves it.
class ChannelTeacherSource : public TeacherSource {
 public:
  ChannelTeacherSource(Communicator& channel, ChannelFormat format, int64_t vocab, int teacher_world_rank,
                       int student_world_rank, at::Device device = at::kCPU, at::Tensor teacher_head = {});
  ~ChannelTeacherSource() override;
  TeacherTargets targets(const MicroBatch& batch) override;
  void prefetch(const MicroBatch& next) override;
  std::string describe() const override { return format_.describe(); }
  int64_t channel_bytes() const override { return bytes_; }

 private:
  struct Posted;
  std::unique_ptr<Posted> post(const MicroBatch& batch);
  Communicator& channel_;
  ChannelFormat format_;
  int64_t vocab_;
  int teacher_rank_, student_rank_;
  at::Device device_;
  at::Tensor head_;
  int64_t bytes_ = 0;
  std::deque<std::unique_ptr<Posted>> posted_;  // receives posted ahead, in consumption order
  // Receive buffers on the channel's device, reused once nobody holds the targets made from them:
  // a fresh [N, V] tensor per micro-batch would pay a page fault per 4 KiB on every message. With
  // prefetch two are in use at once (the current micro-batch's and the next one's).
  at::Tensor reusable(at::IntArrayRef shape, at::ScalarType dtype);
  std::vector<at::Tensor> pool_;
};

}  // namespace deepen
