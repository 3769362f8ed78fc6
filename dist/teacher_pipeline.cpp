// Teacher stage loop: forward-only streaming of micro-batches through P stages to the students.
#include "dist/teacher_pipeline.h"

#include <chrono>
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

std::vector<BatchKey> pipeline_items(const RunPlan& plan, const RankLayout& layout, int pipeline, int64_t step) {
  const int per = layout.students_per_pipeline();
  return step_batches(plan.counts, step, plan.eval_after(step), int64_t{pipeline} * per, per);
}

TeacherStageStats run_teacher_stage(const TeacherStageRun& run) {
  const auto t0 = std::chrono::steady_clock::now();
  const Config& cfg = run.plan->cfg;
  const RankInfo& me = run.layout->ranks.at(static_cast<size_t>(run.world_rank));
  const int stages = run.layout->teacher_stages;
  const bool first = me.stage == 0, last = me.stage == stages - 1;
  const int64_t hidden = run.stage->config().hidden_size;
  const at::ScalarType wire = to_scalar_type(cfg.parallel.activation_dtype);
  const int64_t max_in_flight = cfg.parallel.max_in_flight;
  // Messages between stages live on the pipeline communicator's device (NCCL: the GPU; MPI: host
  // memory, staged to and from the stage's device); the stage's forward moves its input itself.
  const at::Device hop_device = stages > 1 ? run.pipeline->device() : at::Device(at::kCPU);

  std::unique_ptr<LogitChannelSender> sender;
  if (last) {
    sender = std::make_unique<LogitChannelSender>(*run.channel, run.channel_format,
                                                  me.pipeline * run.layout->students_per_pipeline(), max_in_flight);
  }
  std::deque<Hop> outgoing;
  TeacherStageStats stats;
  at::NoGradGuard no_grad;

  stats.steps_done = run.first_step;
  StepTimer timer(teacher_time_parts());
  for (int64_t step = run.first_step; step < run.end_step; ++step) {
    if (run.stop_at && run.stop_at(step)) break;
    for (const BatchKey& key : pipeline_items(*run.plan, *run.layout, me.pipeline, step)) {
      at::Tensor input;
      uint64_t checksum = 0;
      if (first) {
        const MicroBatch mb = timer.time(TeacherPart::kData, [&] { return run.batches->get(key); });
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
      const at::Tensor out = timer.time(TeacherPart::kCompute, [&] { return run.stage->forward(input); });
      const StepTimer::Clock::time_point send_start = StepTimer::Clock::now();
      if (last) {
        sender->send(key, checksum, out);
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
    const StepTime step_time = timer.take(step, "teacher");
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
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace deepen
