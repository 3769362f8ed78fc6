// Device and teacher pieces of a training job (see job_parts.h).
#include "launch/job_parts.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <cstring>

#include <ATen/ATen.h>

#include "config/input_error.h"
#include "dist/communicator.h"
#include "dist/run_device.h"
#include "model/teacher_stage.h"
#include "model/torch_dtype.h"

namespace deepen {

int visible_cuda_devices() { return static_cast<int>(torch::cuda::device_count()); }

at::Device compute_device(const JobPlan& plan, int local_rank) {
  if (plan.device != RunDevice::kCuda) return at::kCPU;
  const int gpus = visible_cuda_devices();
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(rank_cuda_device(plan.backend, local_rank, gpus)));
  c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
  return device;
}

std::shared_ptr<TeacherStage> load_teacher_stage(const JobPlan& plan, int first_layer, int last_layer, bool first,
                                                 bool last, at::Device device) {
  const Config& cfg = plan.run().cfg;
  return TeacherStage::load(plan.teacher->checkpoint, first_layer, last_layer, first, last,
                            to_scalar_type(cfg.teacher.dtype), device, cfg.teacher.cpu_kernels,
                            !plan.channel.hidden);  // hidden: the students hold the head
}

at::Tensor teacher_head_for_channel(const JobPlan& plan, at::Device device) {
  if (!plan.channel.hidden) return {};
  const Config& cfg = plan.run().cfg;
  try {
    return load_teacher_head(plan.teacher->checkpoint, to_scalar_type(cfg.teacher.dtype), device);
  } catch (const InputError& e) {
    throw InputError(cfg.source + ": distill.logits = \"hidden\": every student needs the teacher's LM head: " +
                     e.what());
  }
}

void broadcast_bytes(Communicator* world, std::string& bytes, int root) {
  if (!world || world->size() == 1) return;
  const at::Device wire = world->device();
  at::Tensor size = at::full({1}, static_cast<int64_t>(bytes.size()), at::TensorOptions().dtype(at::kLong).device(wire));
  world->broadcast(size, root);
  at::Tensor buf = at::zeros({size.item<int64_t>()}, at::kByte);
  if (world->rank() == root) std::memcpy(buf.data_ptr(), bytes.data(), bytes.size());
  at::Tensor on_wire = buf.to(wire);
  world->broadcast(on_wire, root);
  buf = on_wire.to(at::kCPU);
  bytes.assign(static_cast<const char*>(buf.data_ptr()), static_cast<size_t>(buf.numel()));
}

}  // namespace deepen
