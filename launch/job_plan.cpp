// The job plan: a config, its tokenizer and the teacher's config.json resolved into every decision.
#include "launch/job_plan.h"

#include <filesystem>
#include <set>

#include "config/input_error.h"
#include "curriculum/growth_schedule.h"
#include "data/tokenizer.h"
#include "dist/run_device.h"
#include "model/hf_config.h"
#include "model/layer_split.h"
#include "study/teacher_groups.h"

namespace deepen {
namespace {

// The teacher's config.json must have exactly the student's vocabulary rows.
TeacherPlan plan_teacher(const Config& cfg, int64_t vocab, const Tokenizer& tok) {
  if (cfg.teacher.checkpoint.empty())
    throw InputError(cfg.source + ": teacher.checkpoint: required by `deepen train` (a Hugging Face folder)");
  const Qwen3Config tc = read_qwen3_config(cfg.teacher.checkpoint + "/config.json");
  if (tc.vocab_size != vocab)
    throw InputError(cfg.teacher.checkpoint + "/config.json: vocab_size: the teacher has " +
                     std::to_string(tc.vocab_size) + " rows, the student " + std::to_string(vocab) + " (" +
                     tok.name() + " tokenizer" + (cfg.student.vocab_size > 0 ? ", student.vocab_size" : ", padded") + ")");
  // The "teacher" growth operator copies the teacher's layers: shapes checked before anything runs.
  if (cfg.curriculum.grow_init == GrowInit::kTeacher) {
    const StudentConfig& s = cfg.student;
    check_same_layer_shapes({s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, false, s.rope_theta},
                            layer_shapes_of(tc), cfg.teacher.checkpoint + "/config.json");
  }
  TeacherPlan t;
  t.checkpoint = cfg.teacher.checkpoint;
  t.layers = tc.num_hidden_layers;
  // The last stage runs the LM head (≈ 3 layers' worth at 8B) unless the students hold it.
  t.head_layers = last_stage_head_layers(cfg.distill.logits, tc.vocab_size, tc.hidden_size, tc.num_attention_heads,
                                         tc.num_key_value_heads, tc.head_dim, tc.intermediate_size);
  return t;
}

// Every run shares the first one's teacher pass and trains in a folder of its own.
void check_runs_share_teacher(const std::vector<Config>& runs, const std::string& job_dir) {
  std::set<std::string> dirs;
  for (const Config& run : runs) {
    if (auto why = teacher_share_difference(runs.front(), run))
      throw InputError(job_dir + ": run \"" + run.run.name + "\" (" + run.source + ") cannot share the teacher with run \"" +
                       runs.front().run.name + "\": " + *why);
    const std::string dir = std::filesystem::weakly_canonical(run.run.out_dir).string();
    if (runs.size() > 1 && dir == std::filesystem::weakly_canonical(job_dir).string())
      throw InputError(job_dir + ": run \"" + run.run.name + "\" trains in the group's own folder; give it run.out_dir of its own");
    if (!dirs.insert(dir).second)
      throw InputError(job_dir + ": two runs train in " + run.run.out_dir + "; each needs run.out_dir of its own");
  }
}

}  // namespace

int64_t student_vocab_size(const Config& cfg, const Tokenizer& tok) {
  const int64_t v = cfg.student.vocab_size > 0 ? cfg.student.vocab_size : tok.padded_vocab_size();
  if (v < tok.vocab_size())
    throw InputError(cfg.source + ": student.vocab_size: " + std::to_string(v) + " is smaller than the " +
                     tok.name() + " tokenizer's " + std::to_string(tok.vocab_size()) + " ids");
  return v;
}

JobPlan plan_single_process_job(const Config& cfg, bool distill, const Tokenizer& tokenizer, int cuda_devices) {
  JobPlan plan;
  // First: run.device = "cuda" without a GPU is the user's mistake.
  plan.device = resolve_run_device(cfg.run.device, cuda_devices, cfg.source);
  plan.backend = Backend::kMpi;
  Config run_cfg = cfg;
  if (cfg.parallel.students != 1) {
    // One process plays every data-parallel student in turn: same global batch, same numbers.
    run_cfg.parallel.grad_accum = cfg.parallel.grad_accum * cfg.parallel.students;
    run_cfg.parallel.students = 1;
  }
  const int64_t vocab = student_vocab_size(cfg, tokenizer);
  plan.from_cache = distill && cfg.distill.source == DistillSource::kCache;
  if (distill && !plan.from_cache) plan.teacher = plan_teacher(cfg, vocab, tokenizer);
  plan.channel = channel_format(cfg.distill, cfg.teacher.dtype);
  // The schedule reads a matched run's budget record: the one read of it in a job.
  plan.runs.push_back(make_run_plan(run_cfg, make_growth_schedule(run_cfg), vocab));
  plan.job_dir = cfg.run.out_dir;
  return plan;
}

JobPlan plan_distributed_job(const Config& cfg, int world_size, const Tokenizer& tokenizer, int cuda_devices,
                             bool nccl_built) {
  return plan_shared_teacher_job({cfg}, cfg.run.out_dir, world_size, tokenizer, cuda_devices, nccl_built);
}

JobPlan plan_shared_teacher_job(const std::vector<Config>& runs, const std::string& job_dir, int world_size,
                                const Tokenizer& tokenizer, int cuda_devices, bool nccl_built) {
  if (runs.empty()) throw InputError(job_dir + ": a job needs at least one run");
  const Config& cfg = runs.front();
  check_runs_share_teacher(runs, job_dir);
  JobPlan plan;
  plan.job_dir = job_dir;
  // Device and backend first (pure decisions, the same on every rank of a homogeneous allocation):
  // a CUDA run's world is NCCL when built with it, else MPI with host staging; see run_device.h.
  plan.device = resolve_run_device(cfg.run.device, cuda_devices, cfg.source);
  plan.backend = world_backend(cfg.parallel.backend, plan.device, nccl_built, cfg.source);
  const int64_t vocab = student_vocab_size(cfg, tokenizer);
  plan.from_cache = cfg.distill.source == DistillSource::kCache;
  if (plan.from_cache) {
    // A run from a teacher cache: students only, each reading the cache (no teacher pass to share).
    if (runs.size() > 1)
      throw InputError(job_dir + ": runs with distill.source = \"cache\" have no teacher pass to share; run each alone");
    plan.layout = make_student_layout(cfg.parallel, world_size);
  } else {
    plan.teacher = plan_teacher(cfg, vocab, tokenizer);
    plan.layout = make_rank_layout(cfg.parallel, world_size, static_cast<int>(plan.teacher->layers),
                                   plan.teacher->head_layers, static_cast<int>(runs.size()));
  }
  plan.channel = channel_format(cfg.distill, cfg.teacher.dtype);
  for (const Config& run : runs) {  // bad budgets fail on every rank, early
    const int64_t run_vocab = student_vocab_size(run, tokenizer);
    // Every run against the teacher, not only the first: a run whose vocabulary differs from the
    // teacher's rows would receive logits of another width mid-training.
    if (&run != &cfg) plan_teacher(run, run_vocab, tokenizer);
    plan.runs.push_back(make_run_plan(run, make_growth_schedule(run), run_vocab));
  }
  return plan;
}

}  // namespace deepen
