// Student training loop: growth at stage boundaries, the distillation step, gradient sync and clipping.
#include "train/student_trainer.h"

#include <chrono>
#include <cmath>
#include <iostream>

#include <ATen/ATen.h>

#include "config/input_error.h"
#include "model/student_from_teacher.h"
#include "train/batch_source.h"
#include "train/compute_threads.h"
#include "train/document_batch.h"
#include "train/student_group.h"
#include "train/teacher_source.h"
#include "train/trainer.h"

namespace deepen {
using Clock = std::chrono::steady_clock;

namespace {

// Blocks frozen at `stage` under the freeze control: the depth before the last growth.
int64_t frozen_blocks(const Config& cfg, const GrowthSchedule& schedule, int stage) {
  if (!cfg.curriculum.freeze_prefix || stage == 0) return 0;
  return schedule.depths[static_cast<size_t>(stage - 1)];
}

}  // namespace

Trainer::Trainer(StudentRun& run)
    : run_(run),
      cfg_(run.plan.cfg),
      group_(*run.group),
      leader_(run.group->rank() == 0),
      device_(run.device),
      out_dir_(run.plan.cfg.run.out_dir),
      store_(run.plan.cfg.run.out_dir, run.plan.cfg.checkpoint.keep),
      guard_(run.plan.cfg.guard) {
  if (!run.batches || !run.group || !run.tokenizer) throw std::invalid_argument("StudentRun: missing parts");
  if (run.plan.counts.students != group_.size())
    throw std::invalid_argument("StudentRun: a plan for " + std::to_string(run.plan.counts.students) +
                                " students run by a group of " + std::to_string(group_.size()));
  schedule_ = run.plan.schedule;
  lr_ = make_lr_schedule(cfg_.optim, schedule_, cfg_.curriculum.rewarmup_steps, reset_each_phase());
  batch_counts_ = run.plan.counts;
  loss_options_ = run.plan.loss;
  loss_options_.ignore_index = kIgnoreLabel;  // right padding of unpacked documents counts for nothing
  if (!run.teacher) loss_options_.alpha = 0.0;  // pretraining: CE on the labels only
  eval_options_ = loss_options_;
  eval_options_.temperature = 1.0;  // validation KL is reported at τ = 1
  eval_options_.alpha = run.teacher ? 0.5 : 0.0;  // both components are returned; the mix is unused
}

RunOutcome Trainer::run() {
  const std::optional<CheckpointStore::Found> resume_from = resume_checkpoint();
  // Before anything is written: a rejected config must leave the run's config.toml and run.json as
  // they are (and they name what differs).
  if (resume_from) check_resumable(*resume_from);
  open_run_folder(resume_from);
  if (resume_from) restore(*resume_from);
  else start_student();
  {
    const ShardedAdamW::WholeScope whole = whole_blocks();
    group_.check_same(student_->parameter_checksum(), "initial student parameters", progress_.steps_done);
  }
  const int64_t total = schedule_.total_steps();
  timer_.restart();
  last_channel_bytes_ = run_.teacher ? run_.teacher->channel_bytes() : 0;
  try {
    for (int64_t step = progress_.steps_done; step < total; ++step) {
      // Stop checks come before any work on the step (the control plane's agreement needs every
      // rank to ask at the same point): stop here, with the state after `step` steps saved.
      if (stop_requested_before(step)) {
        if (step > saved_) timer_.time(StudentPart::kCheckpoint, [&] { checkpoint(); });
        check_records_written();
        return RunOutcome::kStopped;
      }
      run_step(step);
    }
    end_run();
  } catch (const ExitError& e) {
    if (e.code() == kExitDiverged || e.code() == kExitRollback) leave_group(e.what());
    throw;
  }
  return RunOutcome::kFinished;
}

TeacherTargets Trainer::take_targets(const MicroBatch& mb) {
  taken_ = BatchKey{mb.kind, mb.step, mb.student, mb.index};
  return run_.teacher->targets(mb);
}

// Every student of the run does this alike; the teacher's items for the run up to step `until` are
// sent already or on their way (it served the steps it had begun), so taking them in batch order
// ends the run's share of the channel cleanly.
void Trainer::leave_group(const std::string& reason) {
  if (!run_.leave_run || !run_.teacher) return;
  const std::string head = reason.substr(0, reason.find(';'));  // "guard: step 12: the loss is nan ..."
  const int64_t until = run_.leave_run("run " + cfg_.run.name + " leaves the job: " + head);
  const int64_t from = taken_ ? taken_->step : progress_.steps_done;
  int64_t drained = 0;
  for (int64_t s = from; s < until; ++s) {
    const std::vector<BatchKey> keys = step_batches(batch_counts_, s, run_.plan.eval_after(s), group_.rank(), 1);
    size_t first = 0;
    if (taken_ && taken_->step == s)
      for (size_t i = 0; i < keys.size(); ++i)
        if (keys[i] == *taken_) first = i + 1;
    for (size_t i = first; i < keys.size(); ++i) {
      (void)take_targets(run_.batches->get(keys[i]));
      ++drained;
    }
  }
  if (leader_)  // said even with --quiet: the others go on without this run
    std::cerr << "deepen: [" << cfg_.run.name << "] left the job at step " << until << " (" << drained
              << " targets the teacher had sent were taken unused); the other runs go on\n";
}

// A resume goes on from the newest valid checkpoint, or (distributed) from the one student 0 chose
// for every student. A folder that holds an earlier run's records or checkpoints but no valid
// checkpoint is refused (run_folder/progress.h, resume_point): starting over is --fresh's job.
std::optional<CheckpointStore::Found> Trainer::resume_checkpoint() const {
  if (!run_.resume) return std::nullopt;
  if (run_.resume_checkpoint.empty()) return resume_point(out_dir_, cfg_.checkpoint.keep);
  if (auto why = CheckpointStore::verify(run_.resume_checkpoint))
    throw std::runtime_error(run_.resume_checkpoint + ": cannot resume from it: " + *why);
  return CheckpointStore::read(run_.resume_checkpoint);
}

void Trainer::start_student() {
  student_ = std::make_shared<GrowableStudent>(student_spec_from_config(cfg_.student, run_.plan.vocab),
                                               schedule_.depths[0], static_cast<uint64_t>(cfg_.run.seed), device_);
  if (cfg_.student.init == StudentInit::kTeacher) {
    // Every student rank reads the teacher's files itself; the checksum after this proves they agree.
    if (cfg_.teacher.checkpoint.empty())
      throw InputError(cfg_.source + ": student.init = \"teacher\" needs teacher.checkpoint");
    copy_teacher_ends(*student_, cfg_.teacher.checkpoint);
  }
  register_parameters();
}

bool Trainer::stop_requested_before(int64_t step) const {
  return (run_.stop_after_steps && step >= *run_.stop_after_steps) || (run_.stop_requested && run_.stop_requested(step));
}

// One optimizer step: a phase start's growth or reset, the update, its records, then what follows
// it (eval, diagnostics, the progress report, a checkpoint).
void Trainer::run_step(int64_t step) {
  const int stage = schedule_.stage_of(step);
  if (schedule_.is_phase_start(step))
    timer_.time(StudentPart::kGrowth, [&] {
      const ShardedAdamW::WholeScope whole = whole_blocks();
      begin_phase(step, stage);
    });

  // This student's micro-batches of the step, in the order the teacher sends their targets.
  const bool eval_after = run_.plan.eval_after(step);
  const std::vector<BatchKey> batches = step_batches(batch_counts_, step, eval_after, group_.rank(), 1);
  const StepLosses losses = train_step(step, batches);
  progress_.steps_done = step + 1;
  // Real target tokens (padding never counts): packed windows add tokens_per_step every step, as
  // the schedule says; unpacked documents add what the step's documents held. A skipped step
  // consumed its data too, so it counts.
  progress_.tokens += losses.tokens;
  progress_.active_layer_tokens += losses.tokens * student_->depth();
  StepReport report = record_step(step, stage, losses);

  const bool stage_end = schedule_.is_stage_end(step);
  // Evaluation and diagnostics read the whole model: full sharding gathers it on every student
  // (each evaluates its own batches, and only student 0 diagnoses). A skipped step evaluates too:
  // the teacher sent its eval batches' targets, and the channel carries them in order.
  if (eval_after)
    timer_.time(StudentPart::kEval, [&] {
      const ShardedAdamW::WholeScope whole = whole_blocks();
      evaluate(step, stage, stage_end, batches);
    });
  const int64_t total = schedule_.total_steps();
  const bool last = step + 1 == total;
  const bool periodic = cfg_.eval.diagnostics_every > 0 && (step + 1) % cfg_.eval.diagnostics_every == 0;
  if (stage_end || periodic)
    timer_.time(StudentPart::kDiagnostics, [&] {
      const ShardedAdamW::WholeScope whole = whole_blocks();
      if (leader_) diagnose(step, stage, last ? "final" : stage_end ? "stage_end" : "periodic");
    });
  report.last_eval_ce = progress_.last_eval_ce;
  report.last_eval_kl = progress_.last_eval_kl;
  timer_.time(StudentPart::kRecords, [&] {
    if (run_.on_step) run_.on_step(report);
    if (leader_ && run_.print_progress) print_progress(report);
  });

  if (last || (cfg_.checkpoint.every > 0 && (step + 1) % cfg_.checkpoint.every == 0))
    timer_.time(StudentPart::kCheckpoint, [&] { checkpoint(); });
}

// After the last step (or when resumed from the final checkpoint): the records written, then the
// finished student and its Hugging Face export.
void Trainer::end_run() {
  check_records_written();
  if (progress_.steps_done != schedule_.total_steps()) return;
  const ShardedAdamW::WholeScope whole = whole_blocks();
  check_finite_parameters("the finished student");
  if (leader_) finish();
}

// The step's records: its step-time line (every student) and its metrics line (student 0; none for
// a step the guard skipped, whose numbers are in guard.jsonl). The report is what the control plane
// and the progress line show.
StepReport Trainer::record_step(int64_t step, int stage, const StepLosses& losses) {
  // The step's record covers the wall time since the previous one (run_folder/step_time.h).
  const StepTime step_time = timer_.take(step, "student");
  const double seconds = step_time.seconds;
  const auto records_start = Clock::now();
  StepReport report;
  report.step = step;
  report.total_steps = schedule_.total_steps();
  report.stage = stage;
  report.depth = student_->depth();
  report.loss = losses.loss;
  report.kl = losses.kl;
  report.ce = losses.ce;
  report.lr = losses.lr;
  report.tokens_per_s = seconds > 0 ? static_cast<double>(losses.tokens) / seconds : 0;
  const int64_t channel_bytes = run_.teacher ? run_.teacher->channel_bytes() : 0;
  report.channel_bytes_per_s = seconds > 0 ? static_cast<double>(channel_bytes - last_channel_bytes_) / seconds : 0;
  last_channel_bytes_ = channel_bytes;
  report.step_seconds = step_time.seconds;
  report.time_parts = step_time.parts;
  write_records([&] { time_log_->append(step_time); });
  if (records_ && losses.applied)
    write_records([&] {
      records_->metrics({{"step", step},
                         {"stage", stage},
                         {"depth", student_->depth()},
                         {"loss", losses.loss},
                         {"kl", losses.kl},
                         {"ce", losses.ce},
                         {"lr", report.lr},
                         {"grad_norm", losses.grad_norm},
                         {"tokens", progress_.tokens},
                         {"active_layer_tokens", progress_.active_layer_tokens},
                         {"tokens_per_s", report.tokens_per_s},
                         {"channel_bytes", channel_bytes},
                         {"time_s", step_time.seconds},
                         {"time", step_time.to_json()["parts"]}});
    });
  timer_.add(StudentPart::kRecords, std::chrono::duration<double>(Clock::now() - records_start).count());
  return report;
}

void Trainer::register_parameters() {
  const int64_t bucket_bytes = static_cast<int64_t>(cfg_.parallel.bucket_cap_mb * (1 << 20));
  if (!optimizer_ && !sharded_) {
    AdamWOptions o;
    o.weight_decay = cfg_.optim.weight_decay;
    o.beta1 = cfg_.optim.betas[0];
    o.beta2 = cfg_.optim.betas[1];
    o.eps = cfg_.optim.eps;
    if (cfg_.parallel.sharding == Sharding::kGradOp)
      sharded_.emplace(o, group_, bucket_bytes, ShardedAdamW::Mode::kGradOp);
    else if (cfg_.parallel.sharding == Sharding::kFull)
      sharded_.emplace(o, group_, bucket_bytes, ShardedAdamW::Mode::kFull);
    else
      optimizer_.emplace(o);
  }
  // Only trainable parameters hold state: a frozen one (the teacher's embedding, a frozen prefix)
  // has no gradient and no moments, and a parameter that froze drops its moments.
  const auto trainable_params = student_->named_trainable_parameters();
  if (sharded_) {
    // Full sharding gathers a decoder block at a time: a block's parameters are one unit.
    std::vector<int64_t> units;
    for (const auto& [name, p] : trainable_params) units.push_back(block_of_parameter(name));
    sharded_->set_parameters({trainable_params.begin(), trainable_params.end()}, units);
    student_->set_block_gate(sharded_->mode() == ShardedAdamW::Mode::kFull ? &*sharded_ : nullptr);
    return;
  }
  std::vector<std::string> trainable;
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> numels;
  for (const auto& [name, p] : trainable_params) {
    optimizer_->add(name, p);
    trainable.push_back(name);
    tensors.push_back(p);
    numels.push_back(p.numel());
  }
  optimizer_->keep_only(trainable);
  if (group_.size() > 1) {
    if (!reducer_) reducer_.emplace(group_, GradientBuckets::Mode::kAverage);
    const int64_t elem = tensors.empty() ? 4 : tensors.front().element_size();
    reducer_->set_parameters(tensors, make_shard_layout(numels, 1, bucket_elements(bucket_bytes, elem)));
  }
}

ShardedAdamW::WholeScope Trainer::whole_blocks() { return ShardedAdamW::WholeScope(sharded_ ? &*sharded_ : nullptr); }

void Trainer::arm_gradient_reduction() {
  if (!cfg_.parallel.overlap_grad_reduce) return;
  if (sharded_) sharded_->arm_reduction();
  else if (reducer_) reducer_->arm();
}

bool Trainer::reset_each_phase() const { return cfg_.curriculum.phase_policy == PhasePolicy::kReset; }

// A resumed run passes here too when its checkpoint ends a phase: the reset happens in the resumed
// process at the same step, so the two runs stay one.
void Trainer::begin_phase(int64_t step, int stage) {
  if (student_->depth() < schedule_.depth_at(step)) grow(step, stage);
  // The spike window restarts with the phase: appended blocks and a fresh LR warmup may lift the
  // loss past guard.spike_factor x the last phase's median, which is no divergence (a rollback
  // would replay it, a skip would never pass the boundary). Non-finite values are still caught.
  guard_.restore_window({});
  if (!reset_each_phase()) return;
  // The paper's phase transition: fresh AdamW state (moments and step counts) for every trainable
  // parameter; the LR schedule restarts by itself (LrSchedule::restart_each_phase).
  if (sharded_) sharded_->clear();
  else optimizer_->clear();
  register_parameters();
  if (leader_ && run_.print_progress)
    std::cerr << "deepen: step " << step << ": phase " << stage << " starts with fresh optimizer state and LR warmup\n";
}

void Trainer::grow(int64_t step, int stage) {
  const GrowInit init = cfg_.curriculum.grow_init;
  const int64_t before = student_->depth();
  student_->grow_to(schedule_.depth_at(step), init);
  // New blocks: made on every student from the same seed, then student 0's copy is broadcast so
  // agreement never rests on identical arithmetic alone; the checksum proves it.
  std::vector<at::Tensor> fresh;
  for (int64_t i = before; i < student_->depth(); ++i)
    for (const auto& p : student_->block(i)->parameters()) fresh.push_back(p);
  {
    at::NoGradGuard no_grad;
    group_.broadcast_from_first(fresh);
  }
  apply_freeze(stage);
  register_parameters();
  group_.check_same(student_->parameter_checksum(), "parameters after growth", step);
  if (leader_ && run_.print_progress)
    std::cerr << "deepen: step " << step << ": grew " << before << " -> " << student_->depth() << " blocks ("
              << cfg_.curriculum.grow_init << (cfg_.curriculum.freeze_prefix ? ", prefix frozen" : "") << ")\n";
}

void Trainer::apply_freeze(int stage) {
  const int64_t n = frozen_blocks(cfg_, schedule_, stage);
  if (n > 0) student_->freeze_prefix(n, cfg_.curriculum.freeze_head_and_norm);
}

Trainer::StepLosses Trainer::train_step(int64_t step, const std::vector<BatchKey>& batches) {
  StepLosses out;
  // The step's loss is the mean over every real target token of the step, on every student: each
  // micro-batch's mean is weighted by its share of the step's targets (micro_batch_loss_divisor),
  // so the students first agree on the step's count (they sum it; the ids are on the host).
  std::vector<MicroBatch> micro;
  int64_t local_tokens = 0;
  timer_.time(StudentPart::kData, [&] {
    for (const BatchKey& key : batches) {
      if (key.kind != BatchKind::kTrain) continue;
      micro.push_back(run_.batches->get(key));
      local_tokens += target_tokens(micro.back().labels);
    }
  });
  // Prefetch: micro-batch i + 1's teacher targets travel while micro-batch i computes (the first
  // one's during the token count's all-reduce), in the order the teacher sends them.
  auto prefetch = [&](size_t i) {
    if (run_.teacher && i < micro.size()) run_.teacher->prefetch(micro[i]);
  };
  prefetch(0);
  out.tokens = timer_.time(StudentPart::kGradSync, [&] {
    return static_cast<int64_t>(group_.sum({static_cast<double>(local_tokens)})[0]);
  });
  double sums[4] = {0, 0, 0, 0};  // loss·n, kl·n, ce·n, n
  for (size_t i = 0; i < micro.size(); ++i) {
    const MicroBatch& mb = micro[i];
    const TeacherTargets targets = timer_.time(StudentPart::kTeacherWait, [&] {
      return run_.teacher ? take_targets(mb) : TeacherTargets::none();
    });
    prefetch(i + 1);
    // The last micro-batch's backward completes the step's gradients: its buckets may go early.
    // Full sharding reduce-scatters every micro-batch's gradients (no whole gradient is kept).
    const bool full = sharded_ && sharded_->mode() == ShardedAdamW::Mode::kFull;
    if (full || i + 1 == micro.size()) arm_gradient_reduction();
    timer_.time(StudentPart::kCompute, [&] {
      const at::Tensor hidden = student_->forward_hidden(mb.inputs.to(device_));
      const DistillLoss l =
          distill_loss(hidden, student_->head_parameter(), targets, mb.labels.to(device_), loss_options_, &loss_workspace_);
      const int64_t tokens = l.tokens.item<int64_t>();
      (l.loss / micro_batch_loss_divisor(tokens, group_.size(), out.tokens)).backward();
      const double n = static_cast<double>(tokens);
      sums[0] += l.loss.item<double>() * n;
      sums[1] += l.kl.item<double>() * n;
      sums[2] += l.ce.item<double>() * n;
      sums[3] += n;
    });
    if (full) timer_.time(StudentPart::kGradSync, [&] { sharded_->accumulate_reduction(); });
  }
  // Recorded as the step's "lr": the value the update used (guard.lr_scale and rollbacks included).
  out.lr = lr_.at(step) * lr_scale_;
  out.grad_norm = reduce_gradients();
  // One all-reduce of the loss sums, with what the guard and the records need, before anything of
  // the step is applied: a step the students do not all accept changes no weight.
  const StepAgreement agreed = agree_on_step(step, sums, out.grad_norm);
  out.loss = agreed.loss;
  out.kl = agreed.kl;
  out.ce = agreed.ce;
  if (agreed.records_failed) {
    discard_gradients();  // the records end before this step: so does the checkpoint
    stop_for_records();
  }
  out.applied = guard_allows_update(agreed);
  if (out.applied) apply_update(out.lr, out.grad_norm);
  return out;
}

double Trainer::reduce_gradients() {
  if (sharded_) return timer_.time(StudentPart::kGradSync, [&] { return sharded_->reduce_gradients(); });
  if (reducer_) timer_.time(StudentPart::kGradSync, [&] { reducer_->finish(); });
  return timer_.time(StudentPart::kOptimizer, [&] {
    std::vector<at::Tensor> grads;
    for (const auto& [name, p] : student_->named_trainable_parameters())
      if (p.grad().defined()) grads.push_back(p.grad());
    return std::sqrt(sum_of_squares(grads));
  });
}

// Clips the (already averaged) gradients to optim.grad_clip by their global norm, then AdamW.
void Trainer::apply_update(double lr, double norm) {
  const double clip = cfg_.optim.grad_clip;
  if (sharded_) {
    timer_.time(StudentPart::kOptimizer, [&] { sharded_->update(lr, clip, norm); });
    timer_.time(StudentPart::kGradSync, [&] { sharded_->gather_parameters(); });
    return;
  }
  timer_.time(StudentPart::kOptimizer, [&] {
    if (clip > 0 && norm > clip) {
      const double scale = clip / (norm + 1e-6);
      for (const auto& [name, p] : student_->named_trainable_parameters())
        if (p.grad().defined()) p.grad().mul_(scale);
    }
    optimizer_->step(lr);
    optimizer_->zero_grad();
  });
}

void Trainer::discard_gradients() {
  if (sharded_) sharded_->discard_gradients();
  else optimizer_->zero_grad();
}

void Trainer::print_progress(const StepReport& r) const {
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld stage %d depth %lld loss %.4f kl %.4f ce %.4f lr %.2e %.0f tok/s",
                static_cast<long long>(r.step + 1), static_cast<long long>(r.total_steps), r.stage,
                static_cast<long long>(r.depth), r.loss, r.kl, r.ce, r.lr, r.tokens_per_s);
  std::cerr << "[" << cfg_.run.name << "] " << line;
  if (r.last_eval_ce >= 0) std::cerr << " | val ce " << r.last_eval_ce;
  std::cerr << "\n";
}

RunOutcome run_student(StudentRun& run) {
  set_compute_threads(run.plan.cfg.run.threads);
  // student.tf32: LibTorch's switch is per process, like the thread count; CPU matmuls ignore it.
  if (run.device.is_cuda()) at::globalContext().setAllowTF32CuBLAS(run.plan.cfg.student.tf32);
  Trainer trainer(run);
  return trainer.run();
}

}  // namespace deepen
