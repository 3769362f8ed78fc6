// `deepen train` across ranks: plan -> communicators -> teacher stage loop or student trainer.
#include "launch/distributed_job.h"

#include <algorithm>
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
#include "run_folder/checkpoint_store.h"
#include "run_folder/run_folder.h"
#include "run_folder/step_time.h"
#include "teacher_cache/cache_teacher_source.h"
#include "teacher_cache/teacher_cache.h"
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

// Each run's name on the control plane: its students' `run`, and what a teacher stage serves. A job of
// one run: "". Several: run.name, made unique where two runs share it (two seeds of one study run).
// Example: runs pre-grow (seed 1), pre-grow (seed 2), post-grow -> "pre-grow/seed1", "pre-grow/seed2",
// "post-grow".
std::vector<std::string> run_labels(const JobPlan& plan) {
  std::vector<std::string> labels;
  if (plan.runs.size() == 1) return {""};
  for (const RunPlan& r : plan.runs) {
    const auto same = std::count_if(plan.runs.begin(), plan.runs.end(),
                                    [&](const RunPlan& o) { return o.cfg.run.name == r.cfg.run.name; });
    labels.push_back(same > 1 ? r.cfg.run.name + "/seed" + std::to_string(r.cfg.run.seed) : r.cfg.run.name);
  }
  for (size_t r = 0; r < labels.size(); ++r)  // the same name and seed twice: their index tells them apart
    if (std::count(labels.begin(), labels.end(), labels[r]) > 1) labels[r] += "#" + std::to_string(r);
  return labels;
}

struct RankContext {
  const JobPlan& plan;
  const JobOptions& options;
  const Tokenizer& tokenizer;
  MpiSession& mpi;
  RankGroups& groups;
  JobControl& control;
  at::Device device;
  std::vector<int64_t> steps_done;  // per run: the agreed resume point
  std::vector<std::string> resume_checkpoint;  // per run: its folder (empty: a fresh start)
  std::vector<int64_t> end_step;    // per run: where this job stops it (its end, or --stop-after)
  std::vector<std::string> ended;   // per run: why it does not train in this job ("" when it does)
};

int run_teacher_rank(const RankContext& c) {
  const RankLayout& layout = *c.plan.layout;
  const RankInfo& me = layout.ranks.at(static_cast<size_t>(c.mpi.rank()));
  TeacherStageRun run;
  run.channel_format = c.plan.channel;
  run.layout = &layout;
  run.world_rank = c.mpi.rank();
  run.pipeline = c.groups.teacher_pipeline.get();
  run.channel = c.groups.logit_channel.get();
  // Stage 0 reads the ids; with runs to compare, every stage reads their batches' identities.
  std::vector<std::unique_ptr<BatchSource>> batches;
  for (size_t r = 0; r < c.plan.runs.size(); ++r) {
    ServedRun served;
    served.plan = &c.plan.runs[r];
    if (me.stage == 0 || c.plan.runs.size() > 1) {
      batches.push_back(make_shard_batch_source(c.plan.runs[r], c.tokenizer));
      served.batches = batches.back().get();
    }
    served.first_step = c.steps_done[r];
    served.end_step = c.end_step[r];
    run.runs.push_back(served);
  }
  run.stage = load_teacher_stage(c.plan, me.first_layer, me.last_layer, me.stage == 0,
                                 me.stage == layout.teacher_stages - 1, c.device);
  // The runs this stage serves, for the per-run stop (dist/control/agent.h, stop_steps).
  const std::vector<std::string> labels = run_labels(c.plan);
  std::vector<JobControl::ServedSteps> served;
  for (size_t r = 0; r < c.plan.runs.size(); ++r) served.push_back({labels[r], c.steps_done[r], c.end_step[r]});
  c.control.set_served_runs(served);
  run.run_stops = [&c](int64_t s) { return c.control.run_stops(s); };
  const int64_t resumed = *std::min_element(c.steps_done.begin(), c.steps_done.end());
  StepTimeLog time_log(c.plan.job_dir, c.mpi.rank(), resumed > 0 ? std::optional<int64_t>(resumed - 1) : std::nullopt);
  // The job's progress for the control plane: the longest run's schedule.
  const RunPlan& longest = *std::max_element(c.plan.runs.begin(), c.plan.runs.end(), [](const RunPlan& a, const RunPlan& b) {
    return a.schedule.total_steps() < b.schedule.total_steps();
  });
  run.on_step = [&](int64_t s, const StepTime& t) {
    time_log.append(t);
    c.control.report(s, longest.schedule.stage_of(s - 1), longest.schedule.depth_at(s - 1), step_time_metrics(t));
  };
  const TeacherStageStats stats = run_teacher_stage(run);
  if (c.options.print_progress && me.stage == layout.teacher_stages - 1 && stats.seconds > 0)
    std::cerr << "deepen: teacher pipeline " << me.pipeline << ": " << stats.items << " forward passes, "
              << stats.deliveries << " micro-batches delivered, " << stats.channel_bytes / stats.seconds / 1e6
              << " MB/s on the logit channel\n";
  // Requeue when a run's serving stopped before the last step it had to serve (a coordinated stop),
  // or a run is left unfinished by design (--stop-after). Runs that had finished before this job
  // started have nothing to serve: a rerun of a finished group ends at once with 0. (The job's own
  // code follows its runs: dist/control/policy.h, job_exit_code.)
  bool unfinished = false;
  for (size_t r = 0; r < c.plan.runs.size(); ++r)
    unfinished = unfinished || stats.served_end.at(r) < c.end_step[r] ||
                 c.end_step[r] < c.plan.runs[r].schedule.total_steps();
  return unfinished ? kExitRequeue : kExitOk;
}

int run_student_rank(const RankContext& c) {
  const RankLayout& layout = *c.plan.layout;
  const RankInfo& me = layout.ranks.at(static_cast<size_t>(c.mpi.rank()));
  const RunPlan& plan = c.plan.runs.at(static_cast<size_t>(me.run));
  const std::string& ended = c.ended.at(static_cast<size_t>(me.run));
  if (ended == "finished") return kExitOk;
  if (!ended.empty()) {
    // It leaves the job as the guard ended it: by agreement, so the other runs go on.
    c.control.leave_run("run " + plan.cfg.run.name + " diverged earlier");
    throw ExitError(kExitDiverged, ended);
  }
  std::vector<int> student_ranks;
  for (int s = 0; s < layout.students; ++s) student_ranks.push_back(layout.student_rank(s, me.run));
  CommStudentGroup group(*c.groups.students, student_ranks);
  std::unique_ptr<BatchSource> real_batches;
  const std::unique_ptr<BatchSource> batches =
      inject_wrong_batch(make_shard_batch_source(plan, c.tokenizer), real_batches);
  // The targets: the logit channel of this student's pipeline, or (no teacher ranks) the teacher
  // cache, which student 0's start-up checks verified for every rank.
  std::unique_ptr<TeacherSource> source;
  if (c.plan.from_cache)
    source = std::make_unique<CacheTeacherSource>(TeacherCache::open(plan.cfg.cache.dir), *batches, plan.cfg.cache.targets,
                                                  c.device);
  else
    source = std::make_unique<ChannelTeacherSource>(*c.groups.logit_channel, c.plan.channel, plan.vocab,
                                                    layout.teacher_rank(me.pipeline, layout.teacher_stages - 1),
                                                    c.mpi.rank(), c.device, teacher_head_for_channel(c.plan, c.device));
  TeacherSource& teacher = *source;
  const std::unique_ptr<TeacherSource> nan_teacher = inject_nan_targets(teacher, plan.cfg.run.name);
  const int64_t steps_done = c.steps_done.at(static_cast<size_t>(me.run));
  StudentRun run;
  run.plan = plan;
  run.tokenizer = &c.tokenizer;
  run.batches = batches.get();
  run.teacher = nan_teacher ? nan_teacher.get() : &teacher;
  run.group = &group;
  run.world_rank = c.mpi.rank();
  run.device = c.device;
  run.resume = steps_done > 0;
  run.resume_checkpoint = c.resume_checkpoint.at(static_cast<size_t>(me.run));
  run.stop_after_steps = c.options.stop_after_steps;
  run.print_progress = c.options.print_progress;
  run.group_file = c.plan.runs.size() > 1 ? c.options.group_file : "";
  run.stop_requested = [&c](int64_t s) { return c.control.stop_at(s); };
  // In a group a run the guard ends leaves alone; a run alone ends the job (every rank exits 4 or 5).
  if (c.plan.runs.size() > 1) run.leave_run = [&c](const std::string& reason) { return c.control.leave_run(reason); };
  run.on_step = [&c](const StepReport& r) { report_step(c.control, r); };
  return run_student(run) == RunOutcome::kFinished ? kExitOk : kExitRequeue;
}

std::string role_of(const RankInfo& me) {
  return me.is_teacher() ? "teacher p" + std::to_string(me.pipeline) + " s" + std::to_string(me.stage)
                         : "student " + std::to_string(me.student);
}

}  // namespace

int run_planned_distributed_job(const JobPlan& plan, const JobOptions& options, MpiSession& mpi,
                                const Tokenizer& tokenizer) {
  const RankLayout& layout = *plan.layout;
  const Config& cfg = plan.run().cfg;  // the job's shared settings ([control], [parallel], run.device)
  const RankInfo& me = layout.ranks.at(static_cast<size_t>(mpi.rank()));
  const int first_student = layout.student_rank(0);
  // Every rank checks placement (pure, same hostnames everywhere), so a bad one fails all ranks alike.
  const std::vector<std::string> placement = check_placement(layout, mpi.hostnames());
  if (mpi.rank() == first_student && options.print_progress) {
    std::cerr << layout.describe();
    for (const auto& warning : placement) std::cerr << "deepen: WARNING: " << warning << "\n";
  }

  std::unique_ptr<Communicator> world = make_communicator(plan.backend, mpi, cfg.control.nccl_setup_timeout_s);
  // Every run's folder and data, checked by its student 0 for every rank: a job that fails them fails
  // on every rank with the same error and leaves nothing in any run folder.
  AgreedStart start = agree_on_startup(*world, plan, tokenizer, options.resume, options.print_progress);
  // After the NCCL world (which picked the same GPU with the same rule and made it current).
  const int local_rank = node_local_rank([](const char* n) { return std::getenv(n); }, mpi.local_rank());
  const at::Device device = compute_device(plan, local_rank);
  if (mpi.rank() == first_student && options.print_progress)
    std::cerr << "deepen: computing on " << plan.device << ", world backend " << plan.backend << "\n";
  RankGroups groups = make_rank_groups(*world, layout);
  const std::string run_name = me.is_student() ? run_labels(plan).at(size_t(me.run)) : "";
  // The watchdog's way out of a hung collective: abort the world (and every group split from it).
  JobControl control(cfg.control, plan.job_dir, mpi.rank(), mpi.size(), mpi.hostnames(), world.get(), role_of(me),
                     run_name, [&world] { world->abort(); });

  RankContext context{plan, options, tokenizer, mpi, groups, control, device, {}, {}, {}};
  context.steps_done = start.steps_done;
  context.resume_checkpoint = start.resume_checkpoint;
  context.ended = start.ended;
  // Before any model runs: a resumed rank repeats the kernel choices it made before (same rounding),
  // found by its role (its run's student index, or its pipeline and stage), whatever its world rank.
  const bool resumed = me.is_student() ? context.steps_done.at(size_t(me.run)) > 0
                                       : std::any_of(context.steps_done.begin(), context.steps_done.end(),
                                                     [](int64_t s) { return s > 0; });
  const std::string choices =
      me.is_student() ? RunFolder(plan.runs.at(size_t(me.run)).cfg.run.out_dir).cpu_kernel_choices_student(me.student)
                      : RunFolder(plan.job_dir).cpu_kernel_choices_teacher(me.pipeline, me.stage);
  process_cpu_kernel_calibration().record_to(choices, resumed);
  for (size_t r = 0; r < plan.runs.size(); ++r) {
    int64_t end = plan.runs[r].schedule.total_steps();
    if (options.stop_after_steps) end = std::min(end, *options.stop_after_steps);
    // A run that ended (finished, or diverged and not retried) is served nothing.
    if (!start.ended[r].empty()) end = context.steps_done[r];
    context.end_step.push_back(std::max(end, context.steps_done[r]));
  }
  if (mpi.rank() == first_student)  // said even with --quiet: a run the job does not train is news
    for (size_t r = 0; r < plan.runs.size(); ++r)
      if (!start.ended[r].empty())
        std::cerr << "deepen: [" << plan.runs[r].cfg.run.name << "] "
                  << (start.ended[r] == "finished" ? "finished earlier; not trained again" : start.ended[r]) << "\n";

  int rc = kExitFailure;
  std::string message;
  try {
    rc = me.is_teacher() ? run_teacher_rank(context) : run_student_rank(context);
  } catch (const ExitError& e) {
    // A run the divergence guard ended left the job alone, as a finished run does (its students took
    // what the teacher had sent it): the others go on; this rank leaves with its run's code.
    if (!control.run_left()) control.leave_on_failure(std::current_exception());
    rc = e.code();
    message = e.what();
    std::cerr << "deepen: error: " << message << "\n";
  } catch (...) {
    control.leave_on_failure(std::current_exception());  // the reason reaches every rank's log
  }
  // Every rank leaves the control plane before it waits for the others: a run that finished (a
  // shared teacher goes on for the longer runs) is then neither asked about a stop nor watched for
  // progress. Rank 0 (a teacher in every order; student 0 without teacher ranks, a run from a
  // teacher cache) hosts the coordinator: its leaving waits for every other rank's, so the job's
  // exit code is known, and written (DEEPEN_EXIT_CODE_FILE), before any rank ends its process; a
  // launcher that ends the job at the first non-zero exit (mpirun's default) then cuts off nothing,
  // and one killed rank still ends the job.
  control.shutdown(rc, message);
  world->barrier();
  return rc;
}

int run_distributed_train_job(const Config& cfg, const JobOptions& options) {
  MpiSession mpi;
  set_compute_threads_checked(cfg.run.threads, "rank " + std::to_string(mpi.rank()));
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(cfg.data.tokenizer);
  // Every decision first, the same on every rank: a bad config fails all ranks alike, before any
  // communicator exists or anything is written.
  const JobPlan plan = plan_distributed_job(cfg, mpi.size(), *tokenizer, visible_cuda_devices(), nccl_available());
  return run_planned_distributed_job(plan, options, mpi, *tokenizer);
}

int run_shared_teacher_job(const std::vector<Config>& runs, const std::string& job_dir, const JobOptions& options) {
  MpiSession mpi;
  set_compute_threads_checked(runs.at(0).run.threads, "rank " + std::to_string(mpi.rank()));
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(runs.at(0).data.tokenizer);
  const JobPlan plan =
      plan_shared_teacher_job(runs, job_dir, mpi.size(), *tokenizer, visible_cuda_devices(), nccl_available());
  return run_planned_distributed_job(plan, options, mpi, *tokenizer);
}

}  // namespace deepen
