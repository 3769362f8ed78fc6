// The single-process jobs: `deepen pretrain` (CE only) and `deepen train` (teacher in-process).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "config/config.h"

namespace deepen {

struct JobOptions {
  bool resume = true;                       // continue from the newest valid checkpoint if any
  std::optional<int64_t> stop_after_steps;  // stop with a checkpoint after this many steps
  bool print_progress = true;
};

// Both return the process exit code: kExitOk when the curriculum finished, kExitRequeue when it
// stopped early with a checkpoint (stop_after_steps or a signal).
int run_pretrain_job(const Config& cfg, const JobOptions& options);
int run_train_job(const Config& cfg, const JobOptions& options);

// `deepen train` under mpirun/srun: this rank's role (teacher stage or student) comes from the
// layout of [parallel] and the world size. Same exit codes on every rank.
int run_distributed_train_job(const Config& cfg, const JobOptions& options);

// True when this process was started by an MPI launcher with more than one rank (mpirun, srun).
bool launched_with_several_ranks();

class Tokenizer;
// Rows of the student's embedding/head: student.vocab_size, or the tokenizer's padded size.
int64_t student_vocab_size(const Config& cfg, const Tokenizer& tokenizer);
// The teacher's config.json must have exactly the student's vocabulary rows; returns its layers.
int64_t check_teacher_checkpoint(const Config& cfg, int64_t student_vocab, const Tokenizer& tokenizer);
// distill.logits = "hidden": the frozen teacher head a student makes the teacher's logits with
// (lm_head.weight, or the embedding when tied), in teacher.dtype on `device`; undefined otherwise.
// Throws InputError naming the checkpoint, the tensor and the setting when it cannot be read.
at::Tensor teacher_head_for_channel(const Config& cfg, at::Device device);

// CUDA devices this process sees (0 without a GPU, a driver, or a CUDA build of LibTorch).
int visible_cuda_devices();
// The device a rank computes on: `kind` is resolve_run_device's "cpu" | "cuda"; a CUDA rank gets
// rank_cuda_device(world_backend, local_rank, ...)'s GPU (one process: local rank 0), made the
// current device so that nothing lands on GPU 0 by default.
at::Device compute_device(const std::string& kind, const std::string& world_backend, int local_rank);

}  // namespace deepen
