// Trainer: the state of one student's run, shared by the trainer's files, one concern each:
//   student_trainer.cpp     the step loop: growth, train step, gradient sync and clipping
//   trainer_eval.cpp        evaluation on the validation batches (eval.jsonl)
//   trainer_diagnostics.cpp the diagnostics pass on the fixed batch (diagnostics.jsonl)
//   trainer_checkpoint.cpp  the run folder: start records, checkpoint save/restore, final export
//   trainer_faults.cpp      what the students agree on when a step or a write goes wrong: the
//                           divergence guard's verdict, records that could not be written
// Internal to train/: the public entry point is run_student (train/student_trainer.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "curriculum/growth_schedule.h"
#include "curriculum/lr_schedule.h"
#include "model/student.h"
#include "run_folder/checkpoint_store.h"
#include "run_folder/guard_events.h"
#include "run_folder/progress.h"
#include "run_folder/run_records.h"
#include "run_folder/step_time.h"
#include "train/adamw.h"
#include "train/sharded_adamw.h"
#include "train/batch_order.h"
#include "train/distill_loss.h"
#include "train/divergence_guard.h"
#include "train/gradient_buckets.h"
#include "train/micro_batch.h"
#include "train/student_trainer.h"

namespace deepen {

// The config hash a checkpoint must match: the config without its execution settings
// (config/without_execution_settings: control, threads, device, CPU kernels, recomputation, TF32)
// and without its rank layout at the same global batch (config/without_layout), so a requeued job
// may change how and on how many ranks it runs, not what it trains.
uint64_t resume_hash(const Config& cfg);

class Trainer {
 public:
  explicit Trainer(StudentRun& run);
  RunOutcome run();

 private:
  struct StepLosses {
    double loss = 0, kl = 0, ce = 0, grad_norm = 0, lr = 0;
    int64_t tokens = 0;    // real target tokens of the step, over every student
    bool applied = true;   // false: the divergence guard skipped the step's update
  };
  // The step's sums over the students, from the one all-reduce between the gradients' reduction
  // and the update (trainer_faults.cpp): the losses, and per student whether its own loss was
  // finite and whether its records could be written.
  struct StepAgreement {
    double loss = 0, kl = 0, ce = 0;
    StepHealth health;
    bool records_failed = false;  // some student could not write a record since the last agreement
  };

  // student_trainer.cpp: the run, top to bottom, and the step loop.
  std::optional<CheckpointStore::Found> resume_checkpoint() const;
  void start_student();  // a fresh student (random, or the teacher's ends) and its optimizer
  bool stop_requested_before(int64_t step) const;
  void run_step(int64_t step);
  void end_run();
  // The targets of `mb`, remembering which batch was taken last (for leave_group).
  TeacherTargets take_targets(const MicroBatch& mb);
  // The guard ended this run (ExitError 4 or 5): with a shared teacher, agree on the step the run's
  // serving stops at (StudentRun::leave_run) and take every target the teacher sent up to it.
  void leave_group(const std::string& reason);
  void register_parameters();
  bool reset_each_phase() const;                // curriculum.phase_policy = "reset"
  void begin_phase(int64_t step, int stage);     // grow if the depth increases; reset under "reset"
  void grow(int64_t step, int stage);
  void apply_freeze(int stage);
  StepLosses train_step(int64_t step, const std::vector<BatchKey>& batches);
  // The step's gradient reduction, in two halves around the students' agreement on the step:
  // replicated (bucketed all-reduce, then clip and AdamW) or sharded (reduce-scatter, then clip,
  // AdamW on this rank's slices and all-gather). reduce_gradients returns the global norm;
  // discard_gradients drops them instead of applying them (a step the guard skips or stops on).
  double reduce_gradients();
  void apply_update(double lr, double norm);
  void discard_gradients();
  // parallel.overlap_grad_reduce: lets the coming backward launch the gradient buckets.
  void arm_gradient_reduction();
  // parallel.sharding = "full": the whole model on every student for the scope (collective:
  // every student opens it at the same point); otherwise nothing.
  ShardedAdamW::WholeScope whole_blocks();
  StepReport record_step(int64_t step, int stage, const StepLosses& losses);
  void print_progress(const StepReport& r) const;

  // trainer_eval.cpp: validation CE and KL over the eval batches this student owns.
  void evaluate(int64_t step, int stage, bool stage_end, const std::vector<BatchKey>& batches);

  // trainer_diagnostics.cpp: boundary diagnostics on the fixed diagnostic batch (student 0 only).
  // event: "periodic" (every eval.diagnostics_every steps), "stage_end" (after a phase's last step,
  // the model a block is appended to), "final" (after the run's last step). Phase ends and the end
  // add block removal; the end also writes every token's RMS (final_token_rms.json).
  void diagnose(int64_t step, int stage, const char* event);
  // Token classes of the diagnostic batch; padded positions (label kIgnoreLabel) get kPaddingTokenClass.
  at::Tensor token_classes(const at::Tensor& inputs, const at::Tensor& labels) const;

  // trainer_checkpoint.cpp: the run folder.
  // Start records (student 0: config.toml, run.json, the record files; stale temporary checkpoint
  // folders removed) and every student's step-time file, at `resume_from` or fresh.
  void open_run_folder(const std::optional<CheckpointStore::Found>& resume_from);
  void start_run_folder(bool resuming);
  // A checkpoint of the state after progress_.steps_done steps (collective: every student calls it
  // at the same step, and every student throws the same error when it cannot be written).
  void checkpoint();
  // InputError naming the keys that differ when `found` was written with another config.
  void check_resumable(const CheckpointStore::Found& found) const;
  void restore(const CheckpointStore::Found& found);
  // Sharded runs: every student writes its optimizer shard into a staging folder beside the
  // checkpoints and the students agree that all were written; returns the folder.
  std::string write_optimizer_shard(int64_t step);
  void finish();

  // trainer_faults.cpp.
  StepAgreement agree_on_step(int64_t step, const double (&sums)[4], double grad_norm);
  // The guard's verdict on the agreed step: true to apply its update. A skip drops the gradients
  // and returns false; a stop or a rollback drops them and throws ExitError (kExitDiverged,
  // kExitRollback) with the same message on every student.
  bool guard_allows_update(const StepAgreement& agreed);
  // Some student's records could not be written: the step's gradients are dropped, a checkpoint of
  // the state before it is written if it still can be, and every student throws ExitError
  // (kExitFailure) naming the files and the OS's reasons.
  [[noreturn]] void stop_for_records();
  // At the end of the run or a stop (no step agreement follows): whether any student's records
  // failed since the last step; if so, stop_for_records' error.
  void check_records_written();
  // Runs a record write of this student; the first failure is kept (and said at once) instead of
  // thrown, later writes are skipped, and the students act on it at their next agreement.
  void write_records(const std::function<void()>& write);
  // Throws ExitError(kExitDiverged) when a parameter is not finite: no checkpoint, final student or
  // export is written from such weights. The parameters are the same on every student (checked by
  // checksum first), so every student reaches the same verdict.
  void check_finite_parameters(const char* what);
  std::string last_good_checkpoint() const;
  // The newest valid checkpoint a rollback of step `step` can resume from (taken after step - 2 or
  // earlier), or "" when there is none.
  std::string rollback_checkpoint(int64_t step) const;
  // `texts` of every student, in student order (a collective; for error messages only).
  std::vector<std::string> gather_texts(const std::string& mine);

  StudentRun& run_;
  const Config& cfg_;
  StudentGroup& group_;
  bool leader_;
  at::Device device_;
  std::string out_dir_;
  CheckpointStore store_;
  GrowthSchedule schedule_;
  LrSchedule lr_;
  BatchCounts batch_counts_;
  DistillLossOptions loss_options_, eval_options_;
  DistillLossWorkspace loss_workspace_;  // the loss's chunk buffers, kept from micro-batch to micro-batch
  std::shared_ptr<GrowableStudent> student_;
  // One of the two: the whole AdamW state on every student (parallel.sharding = "none"), or its
  // 1/S shard ("grad_op"; "full" shards the blocks' parameters too).
  std::optional<AdamW> optimizer_;
  std::optional<ShardedAdamW> sharded_;
  // Replicated with more than one student: the gradient all-reduce, bucket by bucket.
  std::optional<GradientBuckets> reducer_;
  std::optional<RunRecords> records_;
  TrainProgress progress_;
  StepTimer timer_{student_time_parts()};  // every student rank times its steps
  std::optional<StepTimeLog> time_log_;
  int64_t last_channel_bytes_ = 0;
  // The newest checkpoint of this run (or the one it resumed from): its step count and folder.
  int64_t saved_ = 0;
  std::string saved_dir_;
  DivergenceGuard guard_;
  RollbackState rollbacks_;  // what earlier rollbacks left (guard.jsonl)
  double lr_scale_ = 1;      // guard.lr_scale x the rollbacks' scale
  int64_t skips_ = 0;        // steps the guard skipped in this start of the run
  std::string records_failure_;  // this student's first record that could not be written
  std::optional<BatchKey> taken_;  // the last batch whose teacher targets this student took
};

}  // namespace deepen
