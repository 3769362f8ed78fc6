// Teacher stage loop: forward-only streaming of micro-batches through P stages to the students.
#include "dist/teacher_pipeline.h"

#include <chrono>
#include <algorithm>
#include <climits>
#include <deque>

#include <ATen/ATen.h>

#include "dist/communicator.h"
#include "dist/rank_layout.h"
#include "model/teacher_stage.h"
#include "model/torch_dtype.h"
#include "train/batch_order.h"
#include "train/batch_source.h"

namespace deepen {
namespace {

constexpr int kTagStageHeader = 21;
constexpr int kTagStageActivation = 22;

struct Hop {
  at::Tensor header, activation;
  std::unique_ptr<Request> header_req, activation_req;
};

}  // namespace

std::vector<TeacherItem> pipeline_items(const std::vector<ServedRun>& runs, const RankLayout& layout, int pipeline,
                                        int64_t step) {
  const int per = layout.students_per_pipeline();
  std::vector<ScheduledRun> scheduled;
  for (const ServedRun& r : runs) {
    ScheduledRun s;
    s.counts = r.plan->counts;
    s.first_step = r.first_step;
    s.end_step = r.end_step;
    const RunPlan* plan = r.plan;
    s.eval_after = [plan](int64_t at) { return plan->eval_after(at); };
    // One run shares with nobody: its identities are never compared (and stages past the first need
    // no batches).
    const BatchSource* batches = r.batches;
    s.identity = [batches](const BatchKey& key) { return batches ? batches->identity(key) : std::vector<int64_t>{}; };
    scheduled.push_back(std::move(s));
  }
  return teacher_items(scheduled, step, int64_t{pipeline} * per, per);
}

namespace {

// The first step at or after `step` that serves some run, if any: runs resume at different steps,
// and a run that stopped (or ended) is served no more.
// Example: runs [50, 53) and [100, 120): next_served_step(53) = 100; next_served_step(120) = none.
std::optional<int64_t> next_served_step(const std::vector<ServedRun>& runs, int64_t step) {
  std::optional<int64_t> next;
  for (const ServedRun& r : runs) {
    const int64_t at = std::max(step, r.first_step);
    if (at < r.end_step) next = std::min(next.value_or(at), at);
  }
  return next;
}

// A run's serving ends at its agreed stop step, which a negative value places at its first step.
void apply_stops(std::vector<ServedRun>& runs, const std::vector<std::optional<int64_t>>& stops) {
  for (size_t r = 0; r < runs.size() && r < stops.size(); ++r)
    if (stops[r]) runs[r].end_step = std::min(runs[r].end_step, std::max(*stops[r], runs[r].first_step));
}

}  // namespace

TeacherStageStats run_teacher_stage(const TeacherStageRun& run) {
  const auto t0 = std::chrono::steady_clock::now();
  const Config& cfg = run.runs.at(0).plan->cfg;  // the teacher's settings: equal in every run sharing it
  const RankInfo& me = run.layout->ranks.at(static_cast<size_t>(run.world_rank));
  const int stages = run.layout->teacher_stages;
  const bool first = me.stage == 0, last = me.stage == stages - 1;
  std::vector<ServedRun> runs = run.runs;  // their end_step moves to an agreed stop
  const int64_t hidden = run.stage->config().hidden_size;
  const at::ScalarType wire = to_scalar_type(cfg.parallel.activation_dtype);
  const int64_t max_in_flight = cfg.parallel.max_in_flight;
  // Messages between stages live on the pipeline communicator's device (NCCL: the GPU; MPI: host
  // memory, staged to and from the stage's device); the stage's forward moves its input itself.
  const at::Device hop_device = stages > 1 ? run.pipeline->device() : at::Device(at::kCPU);

  std::unique_ptr<LogitChannelSender> sender;
  if (last) {
    sender = std::make_unique<LogitChannelSender>(*run.channel, run.channel_format,
                                                  me.pipeline * run.layout->students_per_pipeline(), max_in_flight,
                                                  run.layout->runs, run.layout->students_per_pipeline());
  }
  std::deque<Hop> outgoing;
  TeacherStageStats stats;
  at::NoGradGuard no_grad;

  stats.steps_done = next_served_step(runs, 0).value_or(0);
  StepTimer timer(teacher_time_parts());
  for (std::optional<int64_t> next = next_served_step(runs, 0); next;) {
    const int64_t step = *next;
    if (run.run_stops) apply_stops(runs, run.run_stops(step));
    next = next_served_step(runs, step);
    if (next != step) continue;  // nothing to serve at this step any more: ask again at the next one
    next = step + 1;
    const std::vector<TeacherItem> items = pipeline_items(runs, *run.layout, me.pipeline, step);
    for (const TeacherItem& item : items) {
      const BatchKey& key = item.key;
      at::Tensor input;
      uint64_t checksum = 0;
      if (first) {
        const BatchSource& batches = *runs.at(static_cast<size_t>(item.to.front().run)).batches;
        const MicroBatch mb = timer.time(TeacherPart::kData, [&] { return batches.get(key); });
        input = mb.inputs;
        checksum = mb.checksum;
      } else {
        const StepTimer::Clock::time_point recv_start = StepTimer::Clock::now();
        const at::Tensor wire_header = at::empty({kHeaderWords}, at::TensorOptions().dtype(at::kLong).device(hop_device));
        run.pipeline->recv(wire_header, me.stage - 1, kTagStageHeader);
        const at::Tensor header = wire_header.to(at::kCPU);  // the host reads it (a no-op for MPI)
        const int64_t* h = header.data_ptr<int64_t>();
        if (h[0] != static_cast<int64_t>(key.kind) || h[1] != key.step || h[2] != key.student || h[3] != key.index)
          throw CommError("teacher pipeline " + std::to_string(me.pipeline) + " stage " + std::to_string(me.stage) +
                          " (rank " + std::to_string(run.world_rank) + ") expected " + key.describe() +
                          " from the previous stage, got kind " + std::to_string(h[0]) + " step " +
                          std::to_string(h[1]) + " student " + std::to_string(h[2]) + " index " + std::to_string(h[3]));
        checksum = static_cast<uint64_t>(h[4]);
        // Rows and length travel in the header: unpacked documents make every micro-batch as long
        // as its longest document (and the last eval batch may hold fewer documents).
        input = at::empty({h[5], h[6], hidden}, at::TensorOptions().dtype(wire).device(hop_device));
        run.pipeline->recv(input, me.stage - 1, kTagStageActivation);
        timer.add(TeacherPart::kRecvWait, std::chrono::duration<double>(StepTimer::Clock::now() - recv_start).count());
      }
      if (last && run.stage->with_head() && sender->full_logits_dtype(key.kind)) {
        // Full logits: the head writes them straight into the message, chunk by chunk, in the wire's
        // dtype (LogitChannelSender::logits_buffer): no [rows, V] tensor of the stage's own.
        const at::Tensor hidden_states = timer.time(TeacherPart::kCompute, [&] { return run.stage->final_hidden(input); });
        const StepTimer::Clock::time_point room_start = StepTimer::Clock::now();
        at::Tensor logits = sender->logits_buffer(item.to, hidden_states.size(0) * hidden_states.size(1),
                                                  run.stage->config().vocab_size);
        timer.add(TeacherPart::kSendWait, std::chrono::duration<double>(StepTimer::Clock::now() - room_start).count());
        timer.time(TeacherPart::kCompute, [&] { run.stage->head_into(hidden_states, logits); });
        sender->send_logits(item.to, checksum, std::move(logits));
        stats.deliveries += static_cast<int64_t>(item.to.size());
        ++stats.items;
        continue;
      }
      const at::Tensor out = timer.time(TeacherPart::kCompute, [&] { return run.stage->forward(input); });
      const StepTimer::Clock::time_point send_start = StepTimer::Clock::now();
      if (last) {
        sender->send(item.to, checksum, out);
        stats.deliveries += static_cast<int64_t>(item.to.size());
      } else {
        while (static_cast<int64_t>(outgoing.size()) >= max_in_flight) {
          wait_on_host(*outgoing.front().header_req);  // host-side: bounds NCCL's queue too
          wait_on_host(*outgoing.front().activation_req);
          outgoing.pop_front();
        }
        Hop hop;
        hop.header = at::tensor(std::vector<int64_t>{static_cast<int64_t>(key.kind), key.step, key.student,
                                                     key.index, static_cast<int64_t>(checksum), out.size(0),
                                                     out.size(1), 0},
                                at::kLong)
                         .to(hop_device);
        hop.activation = out.to(hop_device, wire).contiguous();
        hop.header_req = run.pipeline->isend(hop.header, me.stage + 1, kTagStageHeader);
        hop.activation_req = run.pipeline->isend(hop.activation, me.stage + 1, kTagStageActivation);
        outgoing.push_back(std::move(hop));
      }
      timer.add(TeacherPart::kSendWait, std::chrono::duration<double>(StepTimer::Clock::now() - send_start).count());
      ++stats.items;
    }
    stats.steps_done = step + 1;
    StepTime step_time = timer.take(step, "teacher");
    step_time.passes = static_cast<int64_t>(items.size());
    if (sender) step_time.held_bytes = sender->peak_held_bytes();
    step_time.deliveries = 0;
    for (const TeacherItem& item : items) step_time.deliveries += static_cast<int64_t>(item.to.size());
    if (run.on_step) timer.time(TeacherPart::kRecords, [&] { run.on_step(step + 1, step_time); });
  }
  for (auto& hop : outgoing) {
    wait_on_host(*hop.header_req);
    wait_on_host(*hop.activation_req);
  }
  if (sender) {
    sender->flush();
    stats.channel_bytes = sender->bytes_sent();
  }
  for (const ServedRun& r : runs) stats.served_end.push_back(std::max(r.end_step, r.first_step));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace deepen
