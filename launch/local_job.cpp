// Single-process jobs: the plan, then tokenizer, data, teacher and the solo student group wired into the trainer.
#include "launch/local_job.h"

#include <iostream>
#include <memory>

#include "config/input_error.h"
#include "data/tokenizer.h"
#include "launch/fault_injection.h"
#include "launch/job_control.h"
#include "launch/job_parts.h"
#include "launch/startup_checks.h"
#include "model/cpu_kernel_choice.h"
#include "model/teacher_stage.h"
#include "run_folder/run_folder.h"
#include "teacher_cache/cache_teacher_source.h"
#include "train/compute_threads.h"
#include "train/shard_batch_source.h"
#include "train/student_group.h"
#include "train/student_trainer.h"
#include "train/teacher_source.h"

namespace deepen {
namespace {

int run_job(const Config& cfg, const JobOptions& options, bool distill) {
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(cfg.data.tokenizer);
  // Every decision first, before anything heavy runs or anything is written to run.out_dir.
  const JobPlan plan = plan_single_process_job(cfg, distill, *tokenizer, visible_cuda_devices());
  // Then the run folder and the data, read only: where it resumes, whether it may, and the shards'
  // tokens (a start refused here leaves no trace). Then the folder is ours alone (another job
  // writing it is refused, a dead one's lock taken over); a job we waited for may have moved it on.
  StartupChecks checks = check_before_start(plan.run(), *tokenizer, options.resume, options.print_progress);
  const RunFolderLock lock(cfg.run.out_dir, cfg.control.watchdog_s);
  if (lock.waited()) checks = check_before_start(plan.run(), *tokenizer, options.resume, options.print_progress);
  set_compute_threads_checked(cfg.run.threads, "this process");
  record_startup(plan.run(), checks);
  const at::Device device = compute_device(plan, 0);
  if (options.print_progress) std::cerr << "deepen: computing on " << device.str() << "\n";
  // Before any model runs: a resumed run repeats the kernel choices it made before (same rounding).
  process_cpu_kernel_calibration().record_to(RunFolder(cfg.run.out_dir).cpu_kernel_choices_student(0), options.resume);
  std::unique_ptr<LocalTeacher> teacher;
  if (plan.teacher) {
    // A hidden-state channel's single-process run goes the same way: a headless teacher, and the
    // head on the student's side.
    const at::Tensor head = teacher_head_for_channel(plan, device);
    auto stage = load_teacher_stage(plan, 0, static_cast<int>(plan.teacher->layers), true, true, device);
    teacher = std::make_unique<LocalTeacher>(stage, plan.channel.topk ? plan.channel.k : 0, plan.run().loss.temperature,
                                             plan.run().loss.tail, plan.channel.vocab_chunk, head);
  }
  // distill.source = "cache": the checked cache, read ahead while the student computes.
  std::unique_ptr<CacheTeacherSource> cached;
  if (plan.from_cache)
    cached = std::make_unique<CacheTeacherSource>(checks.cache, *checks.batches, cfg.cache.targets, device);
  TeacherSource* source = cached ? static_cast<TeacherSource*>(cached.get()) : teacher.get();
  SoloStudentGroup group;
  StudentRun run;
  run.plan = plan.run();
  const std::unique_ptr<TeacherSource> nan_teacher = source ? inject_nan_targets(*source) : nullptr;
  run.tokenizer = tokenizer.get();
  run.batches = checks.batches.get();
  run.teacher = nan_teacher ? nan_teacher.get() : source;
  run.group = &group;
  run.device = device;
  run.resume = checks.steps_done > 0;
  run.resume_checkpoint = checks.resume_checkpoint;
  run.stop_after_steps = options.stop_after_steps;
  run.print_progress = options.print_progress;
  // A single process has its control plane too: SIGTERM/SIGUSR1 stop it with a checkpoint, and
  // /metrics serves its progress.
  JobControl control(cfg.control, cfg.run.out_dir, 0, 1, {"localhost"}, nullptr, "single process", "", [] {});
  run.stop_requested = [&control](int64_t s) { return control.stop_at(s); };
  run.on_step = [&control](const StepReport& r) { report_step(control, r); };
  const int rc = run_student(run) == RunOutcome::kFinished ? kExitOk : kExitRequeue;
  control.shutdown(rc);
  return rc;
}

}  // namespace

int run_pretrain_job(const Config& cfg, const JobOptions& options) { return run_job(cfg, options, false); }
int run_train_job(const Config& cfg, const JobOptions& options) { return run_job(cfg, options, true); }

}  // namespace deepen
