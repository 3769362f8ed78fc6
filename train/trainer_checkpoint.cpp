// The trainer's run folder: config and metadata at the start, checkpoint save and restore, the
// final student and its Hugging Face export (file names: run_folder/run_folder.h).
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include <ATen/ATen.h>

#include "config/hash.h"
#include "config/input_error.h"
#include "data/tokenizer.h"
#include "model/student_io.h"
#include "model/tensor_bridge.h"
#include "run_folder/active_layer_tokens.h"
#include "run_folder/guard_events.h"
#include "run_folder/run_folder.h"
#include "run_folder/run_info.h"
#include "train/optimizer_state_files.h"
#include "train/student_group.h"
#include "train/teacher_source.h"
#include "train/trainer.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

// The settings a checkpoint must be resumed with: all but where and how fast it runs, and on how
// many ranks: the global batch fixes the data order (data/sampler.h), and replicated students hold
// the whole state, so S students resume on S' (and another teacher layout) where the batch is kept.
// Nor [guard]: how a run reacts to divergence, and the lower guard.lr_scale a run the guard stopped
// resumes with, are the recovery's choice (the "lr" of metrics.jsonl records what each step used).
Config resume_relevant(const Config& cfg) {
  Config c = without_layout(without_execution_settings(cfg));
  c.source.clear();
  c.guard = GuardConfig{};
  return c;
}

// Why `found` cannot be resumed with `cfg`, naming the keys that differ from the run's own
// config.toml when it can be read (it is the config the checkpoint was written with).
std::string config_mismatch(const Config& cfg, const CheckpointStore::Found& found, const std::string& out_dir) {
  std::string why = found.dir + ": written by a different config";
  const std::string saved_path = RunFolder(out_dir).config_toml();
  try {
    const Config saved = load_config(saved_path);
    std::string keys;
    for (const ConfigDifference& d : config_differences(resume_relevant(saved), resume_relevant(cfg)))
      keys += (keys.empty() ? "" : "; ") + d.key + " = " + d.a + " there, " + d.b + " here";
    if (!keys.empty()) why += " (" + saved_path + ": " + keys + ")";
  } catch (const std::exception&) {
    // No readable config.toml: the hashes alone.
  }
  return why + "; resume with the run's own config.toml or use a new run.out_dir";
}

}  // namespace

uint64_t resume_hash(const Config& cfg) {
  // Only the settings that differ from the defaults: a key added by a later version, at a default
  // that keeps the earlier behaviour, leaves the hash of an existing run unchanged.
  std::string text;
  for (const ConfigDifference& d : config_differences(resume_relevant(cfg), Config{})) text += d.key + " = " + d.a + "\n";
  return hash64(text);
}

void check_resumable(const Config& cfg, const CheckpointStore::Found& found) {
  if (found.config_hash != resume_hash(cfg)) throw InputError(config_mismatch(cfg, found, cfg.run.out_dir));
}

void Trainer::check_resumable(const CheckpointStore::Found& found) const { deepen::check_resumable(cfg_, found); }

void Trainer::open_run_folder(const std::optional<CheckpointStore::Found>& resume_from) {
  const std::optional<int64_t> after = resume_from ? std::optional<int64_t>(resume_from->step) : std::nullopt;
  // [guard] may change on a resume (the recovery's choice), and guard.lr_scale changes the LR: said
  // loudly and kept in guard.jsonl, so a run of a group never trains on at another LR unseen.
  if (leader_ && resume_from) {
    try {
      const double before = load_config(RunFolder(out_dir_).config_toml()).guard.lr_scale;
      if (before != cfg_.guard.lr_scale) {
        std::cerr << "deepen: [" << cfg_.run.name << "] guard.lr_scale is " << cfg_.guard.lr_scale << " (it was "
                  << before << " at the run's last start): the LR schedule from step " << resume_from->step + 1
                  << " on is scaled by it\n";
        append_guard_event(out_dir_, {{"step", resume_from->step + 1}, {"event", "lr_scale_changed"},
                                      {"from", before}, {"to", cfg_.guard.lr_scale}});
      }
    } catch (const InputError&) {
      // No readable config.toml of the earlier start: nothing to compare with.
    }
  }
  if (leader_) {  // only student 0 writes the run's files
    start_run_folder(resume_from.has_value());
    for (const std::string& dir : store_.remove_stale_temporaries())
      std::cerr << "deepen: removed " << dir << ": the unfinished checkpoint of a process that no longer runs\n";
    records_.emplace(out_dir_, after, cfg_.run.tensorboard);
  }
  time_log_.emplace(out_dir_, run_.world_rank, after);
  // A fresh start has no rollbacks (student 0 removes guard.jsonl); a resume takes the LR scale
  // they left, on every student alike (nobody writes the file while the students start).
  rollbacks_ = resume_from ? read_rollback_state(out_dir_) : RollbackState{};
  lr_scale_ = cfg_.guard.lr_scale * rollbacks_.lr_scale;
  if (leader_ && run_.print_progress && lr_scale_ != 1)
    std::cerr << "deepen: the LR schedule is scaled by " << lr_scale_ << " (guard.lr_scale " << cfg_.guard.lr_scale
              << (rollbacks_.rollbacks > 0 ? " x " + std::to_string(rollbacks_.rollbacks) + " rollback(s)" : std::string())
              << ")\n";
}

void Trainer::start_run_folder(bool resuming) {
  if (!resuming) clear_previous_run(out_dir_);  // a resume can then only find this run's checkpoints
  const std::string resolved = to_toml(cfg_);
  const nlohmann::json meta = {
      {"name", cfg_.run.name},
      {"tokenizer", run_.tokenizer->name()},
      {"vocab_size", run_.plan.vocab},
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
  write_run_start(out_dir_, cfg_.run.name, resolved, meta);
  if (!resuming) std::cout << "# resolved config (" << cfg_.source << ")\n" << resolved << std::flush;
}

// A job killed mid-checkpoint may leave a staging folder behind; it is never read (only the
// checkpoint folder's manifest counts), and the resumed run, which checkpoints the same steps
// again, overwrites and then removes it.
std::string Trainer::write_optimizer_shard(int64_t step) {
  const std::string staging = (fs::path(store_.root()) / (".shards-" + checkpoint_folder_name(step))).string();
  std::string error;
  try {
    fs::create_directories(staging);
    write_tensors(RunFolder::checkpoint_optimizer_shard(staging, group_.rank(), group_.size()), sharded_->shard_state());
  } catch (const std::exception& e) {
    error = "student " + std::to_string(group_.rank()) + ": optimizer shard in " + staging + ": " + e.what();
    // Said now: once the students agree to stop, the launcher may end this rank before it throws.
    std::cerr << "deepen: " << error << std::endl;
  }
  // Every student learns whether all shards were written: a checkpoint missing one is never made.
  const double failed = group_.sum({error.empty() ? 0.0 : 1.0})[0];
  if (failed > 0) {
    // Everyone waits for the cleanup: a rank that ended first would have the launcher kill the
    // leader before it removed the staged shards.
    if (leader_) fs::remove_all(staging);
    group_.sum({0.0});
    throw std::runtime_error(error.empty() ? "checkpoint after step " + std::to_string(step) + ": " +
                                                 std::to_string(static_cast<int64_t>(failed)) +
                                                 " student(s) could not write their optimizer shard (see their errors)"
                                           : error);
  }
  return staging;
}

void Trainer::checkpoint() {
  const ShardedAdamW::WholeScope whole = whole_blocks();  // the student's file holds every block whole
  group_.check_same(student_->parameter_checksum(), "parameters at checkpoint", progress_.steps_done - 1);
  check_finite_parameters("a checkpoint");
  const int64_t step = progress_.steps_done - 1;
  const std::string staging = sharded_ ? write_optimizer_shard(step) : "";
  progress_.depth = student_->depth();
  progress_.guard_window = guard_.window();
  // Student 0 writes; every student learns whether it could, and stops with its error if not (a
  // full disk during a checkpoint stops the job at once, naming the file, on every rank).
  std::string dir, error;
  if (leader_) {
    const TrainProgress progress = progress_;
    try {
      dir = store_.save(step, resume_hash(cfg_), [&](const std::string& tmp) {
        save_student(*student_, RunFolder::checkpoint_student(tmp));
        if (sharded_) {  // the students' shards join the checkpoint: it is whole or it is not made
          for (int64_t r = 0; r < group_.size(); ++r)
            fs::rename(RunFolder::checkpoint_optimizer_shard(staging, r, group_.size()),
                       RunFolder::checkpoint_optimizer_shard(tmp, r, group_.size()));
        } else {
          write_tensors(RunFolder::checkpoint_optimizer(tmp), optimizer_->state_tensors());
        }
        write_train_progress(tmp, progress);
      });
      // Never complete here: a run is finished once final/ is written (Trainer::finish), which a
      // failed or killed export must not claim.
      write_active_layer_tokens(out_dir_, {progress.active_layer_tokens, progress.tokens, progress.steps_done, false});
    } catch (const std::exception& e) {
      error = "checkpoint after step " + std::to_string(step) + ": " + e.what();
      std::cerr << "deepen: " << error << std::endl;  // said now: the launcher may end this rank soon
    }
    std::error_code ignore;
    if (!staging.empty()) fs::remove_all(staging, ignore);
  }
  if (group_.sum({error.empty() ? 0.0 : 1.0})[0] > 0) throw ExitError(kExitFailure, gather_texts(error).front());
  saved_ = progress_.steps_done;
  saved_dir_ = (fs::path(store_.root()) / checkpoint_folder_name(step)).string();
  if (leader_ && run_.print_progress) std::cerr << "deepen: checkpoint " << dir << "\n";
}

void Trainer::restore(const CheckpointStore::Found& found) {
  student_ = load_student(RunFolder::checkpoint_student(found.dir), device_,
                          cfg_.student.cpu_kernels, cfg_.student.recompute);
  progress_ = read_train_progress(found.dir);
  saved_ = progress_.steps_done;
  saved_dir_ = found.dir;
  guard_.restore_window(progress_.guard_window);
  // Freeze first: only the parameters that train at the saved step hold optimizer state.
  if (progress_.steps_done > 0) apply_freeze(schedule_.stage_of(progress_.steps_done - 1));
  std::map<std::string, std::vector<int64_t>> shapes;  // before full sharding empties the blocks
  for (const auto& [name, p] : student_->named_trainable_parameters()) shapes[name] = p.sizes().vec();
  register_parameters();
  // A sharded run on as many students reads only its own shard; any other pairing (another S,
  // another bucket size, replicated <-> sharded) assembles the whole state and takes its part.
  const int64_t shards = optimizer_shard_count(found.dir);
  const bool own_shard =
      sharded_ && shards == group_.size() &&
      sharded_->load_shard_state(
          read_tensors(RunFolder::checkpoint_optimizer_shard(found.dir, group_.rank(), group_.size())));
  if (!own_shard) {
    const auto state = read_whole_optimizer_state(found.dir, shapes);
    // Copies the CPU file tensors into state on the parameters' device.
    if (sharded_) sharded_->load_full_state(state);
    else optimizer_->load_state(state);
  }
  if (leader_ && run_.print_progress)
    std::cerr << "deepen: resuming from " << found.dir << " after " << progress_.steps_done << " steps (depth "
              << student_->depth() << ")\n";
}

// final/ is written under a temporary name and renamed when whole; only then does the run's record
// say complete, which is what the study runner and `deepen study --slurm` take for finished
// (run_folder/progress.h, job_state). A failure or a kill in between leaves the run unfinished: the
// next start resumes from its last checkpoint (after the last step) and writes final/ again.
void Trainer::finish() {
  const RunFolder run(out_dir_);
  const fs::path final_dir(run.final_dir());
  const fs::path tmp = final_dir.string() + ".tmp-" + std::to_string(::getpid());
  if (fs::exists(final_dir) && !fs::is_directory(final_dir))
    throw std::runtime_error(final_dir.string() + ": exists and is not a folder; the finished student goes there. "
                             "Move it away and run the same command again: it resumes after the last step");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_student(*student_, (tmp / fs::path(run.final_student()).filename()).string());
  export_student_hf(*student_, (tmp / fs::path(run.final_hf()).filename()).string());
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  write_active_layer_tokens(out_dir_, {progress_.active_layer_tokens, progress_.tokens, progress_.steps_done, true});
}

}  // namespace deepen
