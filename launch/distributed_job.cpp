// `deepen train` across ranks: layout -> communicators -> teacher stage loop or student trainer.
#include <cstdlib>
#include <iostream>
#include <memory>

#include "config/input_error.h"
#include "curriculum/growth_schedule.h"
#include "data/tokenizer.h"
#include "dist/comm_student_group.h"
#include "dist/communicator.h"
#include "dist/logit_channel.h"
#include "dist/mpi_session.h"
#include "dist/rank_layout.h"
#include "dist/run_device.h"
#include "dist/teacher_pipeline.h"
#include "launch/job_control.h"
#include "launch/student_job.h"
#include "model/cpu_kernel_choice.h"
#include "model/hf_config.h"
#include "model/layer_split.h"
#include "model/teacher_stage.h"
#include "model/torch_dtype.h"
#include "run_folder/checkpoint_store.h"
#include "run_folder/run_folder.h"
#include "run_folder/step_time.h"
#include "train/compute_threads.h"
#include "train/shard_batch_source.h"
#include "train/student_trainer.h"

namespace deepen {
namespace {

// Fault injection for tests (DEEPEN_FAULT_WRONG_BATCH=<student>:<step>): that student trains on
// another step's batch at that step, the desync the logit channel's checksum must catch.
class WrongBatchAt : public BatchSource {
 public:
  WrongBatchAt(const BatchSource& inner, int64_t student, int64_t step) : inner_(inner), student_(student), step_(step) {}
  MicroBatch train(int64_t step, int64_t student, int64_t micro) const override {
    if (student != student_ || step != step_) return inner_.train(step, student, micro);
    MicroBatch wrong = inner_.train(step + 1, student, micro);
    wrong.step = step;
    return wrong;
  }
  MicroBatch eval(int64_t index) const override { return inner_.eval(index); }
  int64_t eval_batches() const override { return inner_.eval_batches(); }
  MicroBatch diagnostic() const override { return inner_.diagnostic(); }

 private:
  const BatchSource& inner_;
  int64_t student_, step_;
};

std::unique_ptr<BatchSource> with_injected_faults(std::unique_ptr<BatchSource> batches,
                                                  std::unique_ptr<BatchSource>& keep) {
  const char* spec = std::getenv("DEEPEN_FAULT_WRONG_BATCH");
  if (!spec) return batches;
  int64_t student = 0, step = 0;
  if (std::sscanf(spec, "%ld:%ld", &student, &step) != 2)
    throw InputError(std::string("DEEPEN_FAULT_WRONG_BATCH: expected <student>:<step>, got ") + spec);
  keep = std::move(batches);
  return std::make_unique<WrongBatchAt>(*keep, student, step);
}

}  // namespace

bool launched_with_several_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    if (const char* v = std::getenv(var); v && std::atoi(v) > 1) return true;
  }
  return false;
}

int run_distributed_train_job(const Config& cfg, const JobOptions& options) {
  MpiSession mpi;
  set_compute_threads(cfg.run.threads);
  // Device and backend first (pure decisions, the same on every rank of a homogeneous allocation):
  // a CUDA run's world is NCCL when built with it, else MPI with host staging; see run_device.h.
  const std::string device_kind = resolve_run_device(cfg.run.device, visible_cuda_devices(), cfg.source);
  const std::string backend = world_backend(cfg.parallel.backend, device_kind, nccl_available(), cfg.source);
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(cfg.data.tokenizer);
  const int64_t vocab = student_vocab_size(cfg, *tokenizer);
  const int64_t teacher_layers = check_teacher_checkpoint(cfg, vocab, *tokenizer);
  // The last stage runs the LM head (≈ 3 layers' worth at 8B) unless the students hold it.
  const Qwen3Config tc = read_qwen3_config(cfg.teacher.checkpoint + "/config.json");
  const double head_layers = last_stage_head_layers(cfg.distill.logits, tc.vocab_size, tc.hidden_size,
                                                    tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim,
                                                    tc.intermediate_size);
  const RankLayout layout = make_rank_layout(cfg.parallel, mpi.size(), static_cast<int>(teacher_layers), head_layers);
  const GrowthSchedule schedule = make_growth_schedule(cfg);  // bad budgets fail on every rank, early
  const int first_student = layout.student_rank(0);
  // Every rank checks placement (pure, same hostnames everywhere), so a bad one fails all ranks alike.
  const std::vector<std::string> placement = check_placement(layout, mpi.hostnames());
  if (mpi.rank() == first_student && options.print_progress) {
    std::cerr << layout.describe();
    for (const auto& warning : placement) std::cerr << "deepen: WARNING: " << warning << "\n";
  }

  std::unique_ptr<Communicator> world = make_communicator(backend, mpi, cfg.control.nccl_setup_timeout_s);
  // After the NCCL world (which picked the same GPU with the same rule and made it current).
  const int local_rank = node_local_rank([](const char* n) { return std::getenv(n); }, mpi.local_rank());
  const at::Device device = compute_device(device_kind, backend, local_rank);
  if (mpi.rank() == first_student && options.print_progress)
    std::cerr << "deepen: computing on " << device_kind << ", world backend " << backend << "\n";
  RankGroups groups = make_rank_groups(*world, layout);
  const RankInfo& me = layout.ranks.at(static_cast<size_t>(mpi.rank()));
  const std::string role = me.is_teacher() ? "teacher p" + std::to_string(me.pipeline) + " s" + std::to_string(me.stage)
                                           : "student " + std::to_string(me.student);
  // The watchdog's way out of a hung collective: abort the world (and every group split from it).
  JobControl control(cfg, mpi.rank(), mpi.size(), mpi.hostnames(), world.get(), role, [&world] { world->abort(); });

  // Student 0 chooses the checkpoint every rank resumes from; teachers start feeding at its step.
  at::Tensor resume_step = at::full({1}, int64_t{-1}, at::TensorOptions().dtype(at::kLong).device(world->device()));
  if (mpi.rank() == first_student && options.resume) {
    if (auto found = CheckpointStore(cfg.run.out_dir, cfg.checkpoint.keep).latest_valid())
      resume_step.fill_(found->step);
  }
  world->broadcast(resume_step, first_student);
  const int64_t steps_done = resume_step.item<int64_t>() + 1;
  // Before any model runs: a resumed rank repeats the kernel choices it made before (same rounding).
  process_cpu_kernel_calibration().record_to(RunFolder(cfg.run.out_dir).cpu_kernel_choices(mpi.rank()), steps_done > 0);
  int64_t end_step = schedule.total_steps();
  if (options.stop_after_steps) end_step = std::min(end_step, *options.stop_after_steps);
  end_step = std::max(end_step, steps_done);

  int rc = kExitOk;
  if (me.is_teacher()) {
    TeacherStageRun run;
    run.cfg = cfg;
    run.layout = &layout;
    run.world_rank = mpi.rank();
    run.pipeline = groups.teacher_pipeline.get();
    run.channel = groups.logit_channel.get();
    std::unique_ptr<BatchSource> batches;
    if (me.stage == 0) {
      batches = make_shard_batch_source(cfg, *tokenizer);
      run.batches = batches.get();
    }
    run.stage = TeacherStage::load(cfg.teacher.checkpoint, me.first_layer, me.last_layer, me.stage == 0,
                                   me.stage == layout.teacher_stages - 1,
                                   to_scalar_type(cfg.teacher.dtype), device,
                                   parse_cpu_kernels(cfg.teacher.cpu_kernels, "teacher.cpu_kernels"),
                                   cfg.distill.logits != "hidden");  // hidden: the students hold the head
    run.first_step = steps_done;
    run.end_step = end_step;
    run.stop_at = [&control](int64_t s) { return control.stop_at(s); };
    StepTimeLog time_log(cfg.run.out_dir, mpi.rank(), steps_done > 0 ? std::optional<int64_t>(steps_done - 1) : std::nullopt);
    run.on_step = [&](int64_t s, const StepTime& t) {
      time_log.append(t);
      control.report(s, schedule.stage_of(s - 1), schedule.depth_at(s - 1), step_time_metrics(t));
    };
    const TeacherStageStats stats = run_teacher_stage(run);
    if (options.print_progress && me.stage == layout.teacher_stages - 1 && stats.seconds > 0)
      std::cerr << "deepen: teacher pipeline " << me.pipeline << ": " << stats.items << " micro-batches, "
                << stats.channel_bytes / stats.seconds / 1e6 << " MB/s on the logit channel\n";
    if (stats.steps_done < schedule.total_steps()) rc = kExitRequeue;
  } else {
    std::vector<int> student_ranks;
    for (int s = 0; s < layout.students; ++s) student_ranks.push_back(layout.student_rank(s));
    CommStudentGroup group(*groups.students, student_ranks);
    ChannelTeacherSource teacher(*groups.logit_channel, channel_format(cfg.distill), vocab,
                                 layout.teacher_rank(me.pipeline, layout.teacher_stages - 1), mpi.rank(), device,
                                 teacher_head_for_channel(cfg, device));
    std::unique_ptr<BatchSource> real_batches;
    const std::unique_ptr<BatchSource> batches =
        with_injected_faults(make_shard_batch_source(cfg, *tokenizer), real_batches);
    StudentRun run;
    run.cfg = cfg;
    run.tokenizer = tokenizer.get();
    run.batches = batches.get();
    run.teacher = &teacher;
    run.group = &group;
    run.world_rank = mpi.rank();
    run.vocab_size = vocab;
    run.device = device;
    run.resume = steps_done > 0;
    if (run.resume)
      run.resume_checkpoint = CheckpointStore(cfg.run.out_dir, cfg.checkpoint.keep).root() + "/" +
                              checkpoint_folder_name(steps_done - 1);
    run.stop_after_steps = options.stop_after_steps;
    run.print_progress = options.print_progress;
    run.stop_requested = [&control](int64_t s) { return control.stop_at(s); };
    run.on_step = [&control](const StepReport& r) { report_step(control, r); };
    rc = run_student(run) == RunOutcome::kFinished ? kExitOk : kExitRequeue;
  }
  world->barrier();
  control.shutdown(rc);
  return rc;
}

}  // namespace deepen
