// Single-process jobs: wires tokenizer, data, teacher and the solo student group into the trainer.
#include "launch/student_job.h"

#include <iostream>
#include <memory>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include "config/input_error.h"
#include "curriculum/growth_schedule.h"
#include "data/tokenizer.h"
#include "dist/run_device.h"
#include "launch/job_control.h"
#include "model/cpu_kernel_choice.h"
#include "model/teacher_stage.h"
#include "model/torch_dtype.h"
#include "run_folder/run_folder.h"
#include "train/shard_batch_source.h"
#include "train/student_group.h"
#include "train/student_trainer.h"
#include "train/teacher_source.h"

namespace deepen {
namespace {

int run_job(const Config& cfg, const JobOptions& options, bool distill) {
  // First, before any heavy work: run.device = "cuda" without a GPU is the user's mistake.
  const std::string kind = resolve_run_device(cfg.run.device, visible_cuda_devices(), cfg.source);
  const at::Device device = compute_device(kind, "mpi", 0);
  if (options.print_progress) std::cerr << "deepen: computing on " << device.str() << "\n";
  // Before any model runs: a resumed run repeats the kernel choices it made before (same rounding).
  process_cpu_kernel_calibration().record_to(RunFolder(cfg.run.out_dir).cpu_kernel_choices(0), options.resume);
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(cfg.data.tokenizer);
  const int64_t vocab = student_vocab_size(cfg, *tokenizer);
  std::unique_ptr<LocalTeacher> teacher;
  if (distill) {
    const int64_t layers = check_teacher_checkpoint(cfg, vocab, *tokenizer);
    // A hidden-state channel's single-process run goes the same way: a headless teacher, and the
    // head on the student's side.
    const at::Tensor head = teacher_head_for_channel(cfg, device);
    auto stage = TeacherStage::load(cfg.teacher.checkpoint, 0, static_cast<int>(layers), true, true,
                                    to_scalar_type(cfg.teacher.dtype), device,
                                    parse_cpu_kernels(cfg.teacher.cpu_kernels, "teacher.cpu_kernels"),
                                    !head.defined());
    const DistillLossOptions lo = distill_loss_options(cfg.distill);
    teacher = std::make_unique<LocalTeacher>(stage, cfg.distill.logits == "topk" ? cfg.distill.topk : 0,
                                             cfg.distill.temperature, lo.tail, cfg.distill.vocab_chunk, head);
  }
  SoloStudentGroup group;
  StudentRun run;
  run.cfg = cfg;
  if (cfg.parallel.students != 1) {
    // One process plays every data-parallel student in turn: same global batch, same numbers.
    run.cfg.parallel.grad_accum = cfg.parallel.grad_accum * cfg.parallel.students;
    run.cfg.parallel.students = 1;
  }
  const std::unique_ptr<BatchSource> batches = make_shard_batch_source(run.cfg, *tokenizer);
  run.tokenizer = tokenizer.get();
  run.batches = batches.get();
  run.teacher = teacher.get();
  run.group = &group;
  run.vocab_size = vocab;
  run.device = device;
  run.resume = options.resume;
  run.stop_after_steps = options.stop_after_steps;
  run.print_progress = options.print_progress;
  // Bad budgets fail here, before the control plane writes its secret into run.out_dir.
  make_growth_schedule(run.cfg);
  // A single process has its control plane too: SIGTERM/SIGUSR1 stop it with a checkpoint, and
  // /metrics serves its progress.
  JobControl control(cfg, 0, 1, {"localhost"}, nullptr, "single process", [] {});
  run.stop_requested = [&control](int64_t s) { return control.stop_at(s); };
  run.on_step = [&control](const StepReport& r) { report_step(control, r); };
  const int rc = run_student(run) == RunOutcome::kFinished ? kExitOk : kExitRequeue;
  control.shutdown(rc);
  return rc;
}

}  // namespace

int64_t student_vocab_size(const Config& cfg, const Tokenizer& tok) {
  const int64_t v = cfg.student.vocab_size > 0 ? cfg.student.vocab_size : tok.padded_vocab_size();
  if (v < tok.vocab_size())
    throw InputError(cfg.source + ": student.vocab_size: " + std::to_string(v) + " is smaller than the " +
                     tok.name() + " tokenizer's " + std::to_string(tok.vocab_size()) + " ids");
  return v;
}

int64_t check_teacher_checkpoint(const Config& cfg, int64_t vocab, const Tokenizer& tok) {
  if (cfg.teacher.checkpoint.empty())
    throw InputError(cfg.source + ": teacher.checkpoint: required by `deepen train` (a Hugging Face folder)");
  const Qwen3Config tc = read_qwen3_config(cfg.teacher.checkpoint + "/config.json");
  if (tc.vocab_size != vocab)
    throw InputError(cfg.teacher.checkpoint + "/config.json: vocab_size: the teacher has " +
                     std::to_string(tc.vocab_size) + " rows, the student " + std::to_string(vocab) + " (" +
                     tok.name() + " tokenizer" + (cfg.student.vocab_size > 0 ? ", student.vocab_size" : ", padded") + ")");
  return tc.num_hidden_layers;
}

at::Tensor teacher_head_for_channel(const Config& cfg, at::Device device) {
  if (cfg.distill.logits != "hidden") return {};
  try {
    return load_teacher_head(cfg.teacher.checkpoint, to_scalar_type(cfg.teacher.dtype), device);
  } catch (const InputError& e) {
    throw InputError(cfg.source + ": distill.logits = \"hidden\": every student needs the teacher's LM head: " +
                     e.what());
  }
}

int visible_cuda_devices() { return static_cast<int>(torch::cuda::device_count()); }

at::Device compute_device(const std::string& kind, const std::string& world_backend, int local_rank) {
  if (kind != "cuda") return at::kCPU;
  const int gpus = visible_cuda_devices();
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(rank_cuda_device(world_backend, local_rank, gpus)));
  c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
  return device;
}

int run_pretrain_job(const Config& cfg, const JobOptions& options) { return run_job(cfg, options, false); }
int run_train_job(const Config& cfg, const JobOptions& options) { return run_job(cfg, options, true); }

}  // namespace deepen
