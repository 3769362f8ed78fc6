// Student training loop: growth at stage boundaries, chunked distillation, eval, diagnostics, checkpoints.
#include "train/student_trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "curriculum/boundary_diagnostics.h"
#include "curriculum/growth_schedule.h"
#include "curriculum/lr_schedule.h"
#include "data/hash.h"
#include "data/tokenizer.h"
#include "launch/checkpoint_store.h"
#include "launch/compute_threads.h"
#include "launch/input_error.h"
#include "launch/run_records.h"
#include "model/safetensors.h"
#include "model/student.h"
#include "model/student_io.h"
#include "model/tensor_bridge.h"
#include "train/adamw.h"
#include "train/batch_source.h"
#include "train/distill_loss.h"
#include "train/eval_schedule.h"
#include "train/student_group.h"
#include "train/teacher_source.h"

namespace deepen {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

uint64_t ids_checksum(const at::Tensor& ids) {
  const at::Tensor c = ids.to(at::kCPU, at::kLong).contiguous();
  return hash64(c.data_ptr(), c.nbytes(), 0x746f6b656e73ULL);
}

namespace {

constexpr const char* kStudentFile = "student.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kProgressFile = "progress.json";

// The config hash a checkpoint must match. [control], run.threads and run.device are left out: they
// change how a job is watched, scheduled and placed, not what it computes (a GPU rounds differently,
// nothing more), so a requeued job may change them.
uint64_t resume_hash(const Config& cfg) {
  Config c = cfg;
  c.control = ControlConfig{};
  c.run.threads = 0;
  c.run.device = "auto";
  c.source.clear();
  return config_hash(c);
}

// Blocks frozen at `stage` under the freeze control: the depth before the last growth.
int64_t frozen_blocks(const Config& cfg, const GrowthSchedule& schedule, int stage) {
  if (!cfg.curriculum.freeze_prefix || stage == 0) return 0;
  return schedule.depths[static_cast<size_t>(stage - 1)];
}

struct Progress {
  int64_t steps_done = 0;
  int64_t tokens = 0;
  int64_t active_layer_tokens = 0;
  double last_eval_ce = -1, last_eval_kl = -1;
};

class Trainer {
 public:
  explicit Trainer(StudentRun& run)
      : run_(run), cfg_(run.cfg), group_(*run.group), leader_(run.group->rank() == 0), device_(run.device) {
    if (!run.batches || !run.group || !run.tokenizer) throw std::invalid_argument("StudentRun: missing parts");
    schedule_ = make_growth_schedule(cfg_);
    lr_ = make_lr_schedule(cfg_.optim, schedule_, cfg_.curriculum.rewarmup_steps);
    loss_options_ = distill_loss_options(cfg_.distill);
    if (!run.teacher) loss_options_.alpha = 0.0;  // pretraining: CE on the labels only
    eval_options_ = loss_options_;
    eval_options_.temperature = 1.0;  // validation KL is reported at τ = 1
    eval_options_.alpha = run.teacher ? 0.5 : 0.0;  // both components are returned; the mix is unused
    out_dir_ = cfg_.run.out_dir;
  }

  RunOutcome run() {
    CheckpointStore store(out_dir_, cfg_.checkpoint.keep);
    std::optional<CheckpointStore::Found> resume_from;
    if (run_.resume && !run_.resume_checkpoint.empty()) {
      if (auto why = CheckpointStore::verify(run_.resume_checkpoint))
        throw std::runtime_error(run_.resume_checkpoint + ": cannot resume from it: " + *why);
      resume_from = CheckpointStore::read(run_.resume_checkpoint);
    } else if (run_.resume) {
      resume_from = store.latest_valid();
    }
    if (leader_) start_run_folder(resume_from.has_value());
    if (leader_)  // only student 0 writes records
      records_.emplace(out_dir_, resume_from ? std::optional<int64_t>(resume_from->step) : std::nullopt);

    if (resume_from) {
      restore(*resume_from);
    } else {
      student_ = std::make_shared<GrowableStudent>(student_spec_from_config(cfg_.student, run_.vocab_size),
                                                   schedule_.depths[0], static_cast<uint64_t>(cfg_.run.seed), device_);
      register_parameters();
    }
    group_.check_same(student_->parameter_checksum(), "initial student parameters", progress_.steps_done);

    const int64_t total = schedule_.total_steps();
    auto tick = Clock::now();
    int64_t last_channel_bytes = run_.teacher ? run_.teacher->channel_bytes() : 0;
    int64_t saved = progress_.steps_done;  // steps covered by the newest checkpoint of this run
    for (int64_t step = progress_.steps_done; step < total; ++step) {
      // Stop checks come before any work on the step (the control plane's agreement needs every
      // rank to ask at the same point): stop here, with the state after `step` steps saved.
      if ((run_.stop_after_steps && step >= *run_.stop_after_steps) ||
          (run_.stop_requested && run_.stop_requested(step))) {
        if (step > saved) checkpoint(store, false);
        return RunOutcome::kStopped;
      }
      const int stage = schedule_.stage_of(step);
      if (student_->depth() < schedule_.depth_at(step)) grow(step, stage);

      const StepLosses losses = train_step(step);
      progress_.steps_done = step + 1;
      progress_.tokens = schedule_.tokens_after(step + 1);
      progress_.active_layer_tokens = schedule_.active_layer_tokens_after(step + 1);

      const auto now = Clock::now();
      const double seconds = std::chrono::duration<double>(now - tick).count();
      tick = now;
      StepReport report;
      report.step = step;
      report.total_steps = total;
      report.stage = stage;
      report.depth = student_->depth();
      report.loss = losses.loss;
      report.kl = losses.kl;
      report.ce = losses.ce;
      report.lr = lr_.at(step);
      report.tokens_per_s = seconds > 0 ? static_cast<double>(schedule_.tokens_per_step) / seconds : 0;
      const int64_t channel_bytes = run_.teacher ? run_.teacher->channel_bytes() : 0;
      report.channel_bytes_per_s = seconds > 0 ? static_cast<double>(channel_bytes - last_channel_bytes) / seconds : 0;
      last_channel_bytes = channel_bytes;
      if (records_) {
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
                           {"channel_bytes", channel_bytes}});
      }

      const bool stage_end = schedule_.is_stage_end(step);
      if (is_eval_step(cfg_, schedule_, step)) evaluate(step, stage, stage_end);
      if (leader_ && cfg_.eval.diagnostics_every > 0 && (step + 1) % cfg_.eval.diagnostics_every == 0)
        diagnose(step, stage, "periodic");
      report.last_eval_ce = progress_.last_eval_ce;
      report.last_eval_kl = progress_.last_eval_kl;
      if (run_.on_step) run_.on_step(report);
      if (leader_ && run_.print_progress) print_progress(report);

      const bool last = step + 1 == total;
      if (last || (cfg_.checkpoint.every > 0 && (step + 1) % cfg_.checkpoint.every == 0)) {
        checkpoint(store, last);
        saved = step + 1;
      }
    }
    if (progress_.steps_done == total && leader_) finish();
    return RunOutcome::kFinished;
  }

 private:
  struct StepLosses {
    double loss = 0, kl = 0, ce = 0, grad_norm = 0;
  };

  void start_run_folder(bool resuming) {
    fs::create_directories(out_dir_);
    const std::string resolved = to_toml(cfg_);
    std::ofstream(fs::path(out_dir_) / "config.toml") << "# resolved config of run " << cfg_.run.name << "\n" << resolved;
    nlohmann::json meta = {
        {"name", cfg_.run.name},
        {"tokenizer", run_.tokenizer->name()},
        {"vocab_size", run_.vocab_size},
        {"teacher", run_.teacher ? run_.teacher->describe() : "none (pretraining, CE only)"},
        {"students", group_.size()},
        {"tokens_per_step", schedule_.tokens_per_step},
        {"total_steps", schedule_.total_steps()},
        {"stage_depths", schedule_.depths},
        {"stage_steps", schedule_.stage_steps},
        {"config_hash", resume_hash(cfg_)},
        {"resumed", resuming},
        {"device", device_.str()},
    };
    std::ofstream(fs::path(out_dir_) / "run.json") << meta.dump(2) << "\n";
    if (!resuming) std::cout << "# resolved config (" << cfg_.source << ")\n" << resolved << std::flush;
  }

  void register_parameters() {
    if (!optimizer_) {
      AdamWOptions o;
      o.weight_decay = cfg_.optim.weight_decay;
      o.beta1 = cfg_.optim.betas[0];
      o.beta2 = cfg_.optim.betas[1];
      o.eps = cfg_.optim.eps;
      optimizer_.emplace(o);
    }
    for (const auto& item : student_->named_parameters()) optimizer_->add(item.key(), item.value());
  }

  void grow(int64_t step, int stage) {
    if (leader_ && student_->depth() > 0) diagnose(step - 1, stage - 1, "growth");
    const GrowInit init = parse_grow_init(cfg_.curriculum.grow_init, cfg_.source + ": curriculum.grow_init");
    const int64_t before = student_->depth();
    student_->grow_to(schedule_.depth_at(step), init);
    // New blocks: made on every student from the same seed, then student 0's copy is broadcast so
    // agreement never rests on identical arithmetic alone; the checksum proves it.
    std::vector<at::Tensor> fresh;
    for (const auto& item : student_->named_parameters()) {
      if (!optimizer_->has(item.key())) fresh.push_back(item.value());
    }
    {
      at::NoGradGuard no_grad;
      group_.broadcast_from_first(fresh);
    }
    register_parameters();
    apply_freeze(stage);
    group_.check_same(student_->parameter_checksum(), "parameters after growth", step);
    if (leader_ && run_.print_progress)
      std::cerr << "deepen: step " << step << ": grew " << before << " -> " << student_->depth() << " blocks ("
                << cfg_.curriculum.grow_init << (cfg_.curriculum.freeze_prefix ? ", prefix frozen" : "") << ")\n";
  }

  void apply_freeze(int stage) {
    const int64_t n = frozen_blocks(cfg_, schedule_, stage);
    if (n > 0) student_->freeze_prefix(n);
  }

  StepLosses train_step(int64_t step) {
    StepLosses out;
    const int64_t accum = cfg_.parallel.grad_accum;
    double sums[4] = {0, 0, 0, 0};  // loss·n, kl·n, ce·n, n
    for (int64_t micro = 0; micro < accum; ++micro) {
      const MicroBatch mb = run_.batches->train(step, group_.rank(), micro);
      const TeacherTargets targets = run_.teacher ? run_.teacher->targets(mb) : TeacherTargets::none();
      const at::Tensor hidden = student_->forward_hidden(mb.inputs.to(device_));
      const DistillLoss l =
          distill_loss(hidden, student_->head_weight(), targets, mb.labels.to(device_), loss_options_);
      (l.loss / static_cast<double>(accum)).backward();
      const double n = static_cast<double>(l.tokens.item<int64_t>());
      sums[0] += l.loss.item<double>() * n;
      sums[1] += l.kl.item<double>() * n;
      sums[2] += l.ce.item<double>() * n;
      sums[3] += n;
    }
    std::vector<at::Tensor> grads;
    for (const auto& [name, p] : student_->named_trainable_parameters()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    group_.average(grads);
    out.grad_norm = clip_gradients(grads);
    optimizer_->step(lr_.at(step));
    optimizer_->zero_grad();
    const std::vector<double> total = group_.sum({sums[0], sums[1], sums[2], sums[3]});
    out.loss = total[0] / total[3];
    out.kl = total[1] / total[3];
    out.ce = total[2] / total[3];
    return out;
  }

  // Global L2 norm of the (already averaged) gradients; scaled down to grad_clip when above it.
  // Per-tensor sums of squares stay on the device and come to the host in one copy (one device
  // synchronization instead of one per parameter); the host adds them in order, as before.
  double clip_gradients(const std::vector<at::Tensor>& grads) {
    std::vector<at::Tensor> sums;
    sums.reserve(grads.size());
    for (const auto& g : grads) sums.push_back(g.to(at::kDouble).pow(2).sum());
    double sq = 0;
    if (!sums.empty()) {
      const at::Tensor host = at::stack(sums).to(at::kCPU);
      const double* p = host.data_ptr<double>();
      for (int64_t i = 0; i < host.numel(); ++i) sq += p[i];
    }
    const double norm = std::sqrt(sq);
    const double clip = cfg_.optim.grad_clip;
    if (clip > 0 && norm > clip) {
      const double scale = clip / (norm + 1e-6);
      for (const auto& g : grads) g.mul_(scale);
    }
    return norm;
  }

  void evaluate(int64_t step, int stage, bool stage_end) {
    at::NoGradGuard no_grad;
    double sums[3] = {0, 0, 0};  // kl·n, ce·n, n
    for (int64_t i = 0; i < run_.batches->eval_batches(); ++i) {
      if (eval_batch_owner(i, group_.size()) != group_.rank()) continue;
      MicroBatch mb = run_.batches->eval(i);
      mb.step = step;  // identifies the batch on a logit channel
      mb.student = group_.rank();
      const TeacherTargets targets = run_.teacher ? run_.teacher->targets(mb) : TeacherTargets::none();
      const at::Tensor hidden = student_->forward_hidden(mb.inputs.to(device_));
      const DistillLoss l =
          distill_loss(hidden, student_->head_weight(), targets, mb.labels.to(device_), eval_options_);
      const double n = static_cast<double>(l.tokens.item<int64_t>());
      sums[0] += l.kl.item<double>() * n;
      sums[1] += l.ce.item<double>() * n;
      sums[2] += n;
    }
    const std::vector<double> total = group_.sum({sums[0], sums[1], sums[2]});
    progress_.last_eval_kl = run_.teacher ? total[0] / total[2] : -1;
    progress_.last_eval_ce = total[1] / total[2];
    if (records_) {
      nlohmann::json record = {{"step", step},
                               {"stage", stage},
                               {"depth", student_->depth()},
                               {"stage_end", stage_end},
                               {"tokens", schedule_.tokens_after(step + 1)},
                               {"active_layer_tokens", schedule_.active_layer_tokens_after(step + 1)},
                               {"val_ce", progress_.last_eval_ce},
                               {"val_tokens", total[2]}};
      record["val_kl"] = run_.teacher ? nlohmann::json(progress_.last_eval_kl) : nlohmann::json(nullptr);
      records_->eval(record);
    }
  }

  // Boundary diagnostics on the fixed diagnostic batch (student 0 only: every student is identical).
  void diagnose(int64_t step, int stage, const char* event) {
    at::NoGradGuard no_grad;
    const MicroBatch mb = run_.batches->diagnostic();
    // Classes stay on the CPU: the diagnostics bring the per-token statistics there to average them.
    const at::Tensor classes = token_classes(mb.inputs);
    const std::vector<at::Tensor> stream = student_->residual_stream(mb.inputs.to(device_));
    const int64_t depth = student_->depth();
    // stream = [entering block 0, ..., entering block depth-1, output of the last block]: the last
    // entry is the boundary representation an appended block would receive.
    const std::vector<at::Tensor> entering(stream.begin(), stream.end() - 1);
    nlohmann::json record;
    record["residual"] = to_json(residual_scale(entering, stream.back(), classes));
    record["identity_last_block"] = to_json(identity_mapping(stream[static_cast<size_t>(depth - 1)], stream.back(), classes));
    record["step"] = step;
    record["stage"] = stage;
    record["depth"] = depth;
    record["event"] = event;
    records_->diagnostics(record);
  }

  at::Tensor token_classes(const at::Tensor& inputs) const {
    const at::Tensor ids = inputs.to(at::kCPU, at::kLong).contiguous();
    at::Tensor classes = at::empty(ids.sizes(), at::kLong);
    const int64_t rows = ids.size(0), cols = ids.size(1);
    const int64_t* in = ids.data_ptr<int64_t>();
    int64_t* out = classes.data_ptr<int64_t>();
    std::vector<int32_t> row(static_cast<size_t>(cols));
    for (int64_t b = 0; b < rows; ++b) {
      for (int64_t t = 0; t < cols; ++t) row[static_cast<size_t>(t)] = static_cast<int32_t>(in[b * cols + t]);
      const std::vector<TokenClass> c = classify_tokens(*run_.tokenizer, row);
      for (int64_t t = 0; t < cols; ++t) out[b * cols + t] = static_cast<int64_t>(c[static_cast<size_t>(t)]);
    }
    return classes;
  }

  void checkpoint(CheckpointStore& store, bool final_step) {
    group_.check_same(student_->parameter_checksum(), "parameters at checkpoint", progress_.steps_done - 1);
    if (!leader_) return;
    const int64_t steps = progress_.steps_done;
    const std::string dir = store.save(steps - 1, resume_hash(cfg_), [&](const std::string& tmp) {
      save_student(*student_, (fs::path(tmp) / kStudentFile).string());
      write_tensors((fs::path(tmp) / kOptimizerFile).string(), optimizer_->state_tensors());
      nlohmann::json progress = {{"steps_done", steps},
                                 {"tokens", progress_.tokens},
                                 {"active_layer_tokens", progress_.active_layer_tokens},
                                 {"depth", student_->depth()},
                                 {"last_eval_ce", progress_.last_eval_ce},
                                 {"last_eval_kl", progress_.last_eval_kl}};
      const std::string path = (fs::path(tmp) / kProgressFile).string();
      std::ofstream out(path);
      out << progress.dump(2) << "\n";
      out.flush();
      if (!out) throw std::runtime_error(path + ": write failed");
    });
    write_active_layer_tokens(out_dir_, {progress_.active_layer_tokens, progress_.tokens, steps, final_step});
    if (run_.print_progress) std::cerr << "deepen: checkpoint " << dir << "\n";
  }

  void restore(const CheckpointStore::Found& found) {
    if (found.config_hash != resume_hash(cfg_))
      throw InputError(found.dir + ": written by a different config (hash " + std::to_string(found.config_hash) +
                       ", this config " + std::to_string(resume_hash(cfg_)) +
                       "); resume with the run's own config.toml or use a new run.out_dir");
    student_ = load_student((fs::path(found.dir) / kStudentFile).string(), device_);
    register_parameters();
    const SafetensorsFile opt = SafetensorsFile::open((fs::path(found.dir) / kOptimizerFile).string());
    std::map<std::string, at::Tensor> state;
    for (const auto& info : opt.tensors()) state[info.name] = file_tensor(opt, info);
    optimizer_->load_state(state);  // copies the CPU file tensors into state on the parameters' device
    std::ifstream in(fs::path(found.dir) / kProgressFile);
    const nlohmann::json p = nlohmann::json::parse(in);
    progress_.steps_done = p.at("steps_done").get<int64_t>();
    progress_.tokens = p.at("tokens").get<int64_t>();
    progress_.active_layer_tokens = p.at("active_layer_tokens").get<int64_t>();
    progress_.last_eval_ce = p.value("last_eval_ce", -1.0);
    progress_.last_eval_kl = p.value("last_eval_kl", -1.0);
    if (progress_.steps_done > 0) apply_freeze(schedule_.stage_of(progress_.steps_done - 1));
    if (leader_ && run_.print_progress)
      std::cerr << "deepen: resuming from " << found.dir << " after " << progress_.steps_done << " steps (depth "
                << student_->depth() << ")\n";
  }

  void finish() {
    const fs::path final_dir = fs::path(out_dir_) / "final";
    fs::create_directories(final_dir);
    save_student(*student_, (final_dir / kStudentFile).string());
    export_student_hf(*student_, (final_dir / "hf").string());
  }

  void print_progress(const StepReport& r) const {
    char line[256];
    std::snprintf(line, sizeof line, "step %lld/%lld stage %d depth %lld loss %.4f kl %.4f ce %.4f lr %.2e %.0f tok/s",
                  static_cast<long long>(r.step + 1), static_cast<long long>(r.total_steps), r.stage,
                  static_cast<long long>(r.depth), r.loss, r.kl, r.ce, r.lr, r.tokens_per_s);
    std::cerr << "[" << cfg_.run.name << "] " << line;
    if (r.last_eval_ce >= 0) std::cerr << " | val ce " << r.last_eval_ce;
    std::cerr << "\n";
  }

  StudentRun& run_;
  const Config& cfg_;
  StudentGroup& group_;
  bool leader_;
  at::Device device_;
  std::string out_dir_;
  GrowthSchedule schedule_;
  LrSchedule lr_;
  DistillLossOptions loss_options_, eval_options_;
  std::shared_ptr<GrowableStudent> student_;
  std::optional<AdamW> optimizer_;
  std::optional<RunRecords> records_;
  Progress progress_;
};

}  // namespace

RunOutcome run_student(StudentRun& run) {
  set_compute_threads(run.cfg.run.threads);
  Trainer trainer(run);
  return trainer.run();
}

}  // namespace deepen
