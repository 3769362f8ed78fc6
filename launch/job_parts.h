// The parts both training jobs build from their plan: the compute device, the teacher's pieces, and
// the one way a distributed job sends rank r's bytes to every rank.
#pragma once

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "launch/job_plan.h"

namespace deepen {

class Communicator;
class TeacherStage;

// CUDA devices this process sees (0 without a GPU, a driver, or a CUDA build of LibTorch).
int visible_cuda_devices();

// The device a rank computes on: the plan's resolved device; a CUDA rank gets rank_cuda_device's
// GPU for the plan's backend and its node-local rank (one process: local rank 0), made the current
// device so that nothing lands on GPU 0 by default.
at::Device compute_device(const JobPlan& plan, int local_rank);

// Teacher layers [first_layer, last_layer) on `device` in teacher.dtype; `embed` on the first stage,
// the final norm and (unless the channel carries hidden states) the LM head on the last.
std::shared_ptr<TeacherStage> load_teacher_stage(const JobPlan& plan, int first_layer, int last_layer, bool first,
                                                 bool last, at::Device device);

// The hidden-state channel: the frozen teacher head a student makes the teacher's logits with
// (lm_head.weight, or the embedding when tied), in teacher.dtype on `device`; undefined for the
// other channels. InputError naming the checkpoint, the tensor and the setting when unreadable.
at::Tensor teacher_head_for_channel(const JobPlan& plan, at::Device device);

// Sends `root`'s bytes to every rank of `world` (nothing without a world, or with one rank): the
// size first, then the bytes, as tensors on the world's device (NCCL moves only device memory).
void broadcast_bytes(Communicator* world, std::string& bytes, int root = 0);

}  // namespace deepen
