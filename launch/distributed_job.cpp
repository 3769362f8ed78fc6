// `deepen train` across ranks: plan -> communicators -> teacher stage loop or student trainer.
#include "launch/distributed_job.h"

#include <cstdlib>
#include <iostream>
#include <memory>

#include "config/input_error.h"
#include "data/tokenizer.h"
#include "dist/comm_student_group.h"
#include "dist/communicator.h"
#include "dist/logit_channel.h"
#include "dist/mpi_session.h"
#include "dist/rank_layout.h"
#include "dist/run_device.h"
#include "dist/teacher_pipeline.h"
#include "launch/fault_injection.h"
#include "launch/job_control.h"
#include "launch/job_parts.h"
#include "launch/startup_checks.h"
#include "model/cpu_kernel_choice.h"
#include "model/teacher_stage.h"
#include "run_folder/run_folder.h"
#include "run_folder/step_time.h"
#include "train/compute_threads.h"
#include "train/shard_batch_source.h"
#include "train/student_trainer.h"

namespace deepen {

bool launched_with_several_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    if (const char* v = std::getenv(var); v && std::atoi(v) > 1) return true;
  }
  return false;
}

namespace {

struct RankContext {
  const JobPlan& plan;
  const JobOptions& options;
  const Tokenizer& tokenizer;
  MpiSession& mpi;
  RankGroups& groups;
  JobControl& control;
  at::Device device;
  int64_t steps_done = 0;         // agreed resume point
  std::string resume_checkpoint;  // its folder (empty: a fresh start)
  int64_t end_step = 0;
};

int run_teacher_rank(const RankContext& c) {
  const RankLayout& layout = *c.plan.layout;
  const RankInfo& me = layout.ranks.at(static_cast<size_t>(c.mpi.rank()));
  TeacherStageRun run;
  run.plan = &c.plan.run;
  run.channel_format = c.plan.channel;
  run.layout = &layout;
  run.world_rank = c.mpi.rank();
  run.pipeline = c.groups.teacher_pipeline.get();
  run.channel = c.groups.logit_channel.get();
  std::unique_ptr<BatchSource> batches;
  if (me.stage == 0) {
    batches = make_shard_batch_source(c.plan.run, c.tokenizer);
    run.batches = batches.get();
  }
  run.stage = load_teacher_stage(c.plan, me.first_layer, me.last_layer, me.stage == 0,
                                 me.stage == layout.teacher_stages - 1, c.device);
  run.first_step = c.steps_done;
  run.end_step = c.end_step;
  run.stop_at = [&c](int64_t s) { return c.control.stop_at(s); };
  StepTimeLog time_log(c.plan.run.cfg.run.out_dir, c.mpi.rank(),
                       c.steps_done > 0 ? std::optional<int64_t>(c.steps_done - 1) : std::nullopt);
  const GrowthSchedule& schedule = c.plan.run.schedule;
  run.on_step = [&](int64_t s, const StepTime& t) {
    time_log.append(t);
    c.control.report(s, schedule.stage_of(s - 1), schedule.depth_at(s - 1), step_time_metrics(t));
  };
  const TeacherStageStats stats = run_teacher_stage(run);
  if (c.options.print_progress && me.stage == layout.teacher_stages - 1 && stats.seconds > 0)
    std::cerr << "deepen: teacher pipeline " << me.pipeline << ": " << stats.items << " micro-batches, "
              << stats.channel_bytes / stats.seconds / 1e6 << " MB/s on the logit channel\n";
  return stats.steps_done < schedule.total_steps() ? kExitRequeue : kExitOk;
}

int run_student_rank(const RankContext& c) {
  const RankLayout& layout = *c.plan.layout;
  const RankInfo& me = layout.ranks.at(static_cast<size_t>(c.mpi.rank()));
  std::vector<int> student_ranks;
  for (int s = 0; s < layout.students; ++s) student_ranks.push_back(layout.student_rank(s));
  CommStudentGroup group(*c.groups.students, student_ranks);
  ChannelTeacherSource teacher(*c.groups.logit_channel, c.plan.channel, c.plan.run.vocab,
                               layout.teacher_rank(me.pipeline, layout.teacher_stages - 1), c.mpi.rank(), c.device,
                               teacher_head_for_channel(c.plan, c.device));
  std::unique_ptr<BatchSource> real_batches;
  const std::unique_ptr<BatchSource> batches =
      inject_wrong_batch(make_shard_batch_source(c.plan.run, c.tokenizer), real_batches);
  const std::unique_ptr<TeacherSource> nan_teacher = inject_nan_targets(teacher);
  StudentRun run;
  run.plan = c.plan.run;
  run.tokenizer = &c.tokenizer;
  run.batches = batches.get();
  run.teacher = nan_teacher ? nan_teacher.get() : &teacher;
  run.group = &group;
  run.world_rank = c.mpi.rank();
  run.device = c.device;
  run.resume = c.steps_done > 0;
  run.resume_checkpoint = c.resume_checkpoint;
  run.stop_after_steps = c.options.stop_after_steps;
  run.print_progress = c.options.print_progress;
  run.stop_requested = [&c](int64_t s) { return c.control.stop_at(s); };
  run.on_step = [&c](const StepReport& r) { report_step(c.control, r); };
  return run_student(run) == RunOutcome::kFinished ? kExitOk : kExitRequeue;
}

}  // namespace

int run_distributed_train_job(const Config& cfg, const JobOptions& options) {
  MpiSession mpi;
  set_compute_threads(cfg.run.threads);
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(cfg.data.tokenizer);
  // Every decision first, the same on every rank: a bad config fails all ranks alike, before any
  // communicator exists or anything is written.
  const JobPlan plan = plan_distributed_job(cfg, mpi.size(), *tokenizer, visible_cuda_devices(), nccl_available());
  const RankLayout& layout = *plan.layout;
  const int first_student = layout.student_rank(0);
  // Every rank checks placement (pure, same hostnames everywhere), so a bad one fails all ranks alike.
  const std::vector<std::string> placement = check_placement(layout, mpi.hostnames());
  if (mpi.rank() == first_student && options.print_progress) {
    std::cerr << layout.describe();
    for (const auto& warning : placement) std::cerr << "deepen: WARNING: " << warning << "\n";
  }

  std::unique_ptr<Communicator> world = make_communicator(plan.backend, mpi, cfg.control.nccl_setup_timeout_s);
  // The run folder's and the data's checks, by the first student for every rank: a job that fails
  // them fails on every rank with the same error and leaves nothing in run.out_dir.
  StartupChecks checks =
      agree_on_startup(*world, plan, *tokenizer, options.resume, options.print_progress, first_student);
  // After the NCCL world (which picked the same GPU with the same rule and made it current).
  const int local_rank = node_local_rank([](const char* n) { return std::getenv(n); }, mpi.local_rank());
  const at::Device device = compute_device(plan, local_rank);
  if (mpi.rank() == first_student && options.print_progress)
    std::cerr << "deepen: computing on " << plan.device << ", world backend " << plan.backend << "\n";
  RankGroups groups = make_rank_groups(*world, layout);
  const RankInfo& me = layout.ranks.at(static_cast<size_t>(mpi.rank()));
  const std::string role = me.is_teacher() ? "teacher p" + std::to_string(me.pipeline) + " s" + std::to_string(me.stage)
                                           : "student " + std::to_string(me.student);
  // The watchdog's way out of a hung collective: abort the world (and every group split from it).
  JobControl control(cfg, mpi.rank(), mpi.size(), mpi.hostnames(), world.get(), role, [&world] { world->abort(); });

  RankContext context{plan, options, *tokenizer, mpi, groups, control, device};
  context.steps_done = checks.steps_done;
  context.resume_checkpoint = checks.resume_checkpoint;
  // Before any model runs: a resumed rank repeats the kernel choices it made before (same rounding).
  process_cpu_kernel_calibration().record_to(RunFolder(cfg.run.out_dir).cpu_kernel_choices(mpi.rank()),
                                             context.steps_done > 0);
  context.end_step = plan.run.schedule.total_steps();
  if (options.stop_after_steps) context.end_step = std::min(context.end_step, *options.stop_after_steps);
  context.end_step = std::max(context.end_step, context.steps_done);

  int rc = kExitFailure;
  try {
    rc = me.is_teacher() ? run_teacher_rank(context) : run_student_rank(context);
    world->barrier();
  } catch (...) {
    control.leave_on_failure(std::current_exception());  // the reason reaches every rank's log
  }
  control.shutdown(rc);
  return rc;
}

}  // namespace deepen
