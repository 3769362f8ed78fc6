// Trainer: the state of one student's run, shared by the trainer's files, one concern each:
//   student_trainer.cpp     the step loop: growth, train step, gradient sync and clipping
//   trainer_eval.cpp        evaluation on the validation batches (eval.jsonl)
//   trainer_diagnostics.cpp the diagnostics pass on the fixed batch (diagnostics.jsonl)
//   trainer_checkpoint.cpp  the run folder: start records, checkpoint save/restore, final export
// Internal to train/: the public entry point is run_student (train/student_trainer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "curriculum/growth_schedule.h"
#include "curriculum/lr_schedule.h"
#include "model/student.h"
#include "run_folder/checkpoint_store.h"
#include "run_folder/progress.h"
#include "run_folder/run_records.h"
#include "run_folder/step_time.h"
#include "train/adamw.h"
#include "train/sharded_adamw.h"
#include "train/batch_order.h"
#include "train/distill_loss.h"
#include "train/gradient_buckets.h"
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
    int64_t tokens = 0;  // real target tokens of the step, over every student
  };

  // student_trainer.cpp: the step loop.
  void register_parameters();
  bool reset_each_phase() const;                // curriculum.phase_policy = "reset"
  void begin_phase(int64_t step, int stage);     // grow if the depth increases; reset under "reset"
  void grow(int64_t step, int stage);
  void apply_freeze(int stage);
  StepLosses train_step(int64_t step, const std::vector<BatchKey>& batches);
  double clip_gradients(const std::vector<at::Tensor>& grads);
  // The step's gradient reduction and update: replicated (bucketed all-reduce, clip, AdamW) or
  // sharded (reduce-scatter, clip, AdamW on this rank's slices, all-gather). Returns the norm.
  double reduce_and_update(double lr);
  // parallel.overlap_grad_reduce: lets the coming backward launch the gradient buckets.
  void arm_gradient_reduction();
  // parallel.sharding = "full": the whole model on every student for the scope (collective:
  // every student opens it at the same point); otherwise nothing.
  ShardedAdamW::WholeScope whole_blocks();
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
  void start_run_folder(bool resuming);
  void checkpoint(CheckpointStore& store, bool final_step);
  // InputError naming the keys that differ when `found` was written with another config.
  void check_resumable(const CheckpointStore::Found& found) const;
  void restore(const CheckpointStore::Found& found);
  // Sharded runs: every student writes its optimizer shard into a staging folder beside the
  // checkpoints and the students agree that all were written; returns the folder.
  std::string write_optimizer_shard(const CheckpointStore& store, int64_t step);
  void finish();

  StudentRun& run_;
  const Config& cfg_;
  StudentGroup& group_;
  bool leader_;
  at::Device device_;
  std::string out_dir_;
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
};

}  // namespace deepen
