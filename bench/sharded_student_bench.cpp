// Memory per student rank of real training steps under parallel.sharding = "none" | "grad_op" |
// "full", on real MPI ranks, against `deepen plan`'s memory model (plan/memory_model.h).
//
//   build/bench/sharded_student_bench [--students 2] [--hidden 512] [--layers 12] [--intermediate 1536]
//                                     [--vocab 4096] [--seq 256] [--micro-batch 2] [--micro-batches 2]
//                                     [--steps 2]
//
// Run without mpirun: the driver starts `mpirun -np S <this> --worker --sharding <mode>` once per
// mode, so each mode's ranks start clean. Every rank builds the same fp32 GrowableStudent (untied,
// op-sequence kernels, recompute = "layer" in all three modes, so only the sharding differs) and
// trains it as the trainer does: per step, `micro-batches` forward + chunked CE (distill_loss with
// no teacher) + backward, then the mode's reduction and AdamW (replicated: the trainer's bucketed
// all-reduce; grad_op / full: ShardedAdamW, full reduce-scattering after every micro-batch and
// gathering each block around its use), buckets launched from inside the backward as the trainer
// launches them by default. Each rank reports: the parameter values it holds between
// steps (tensors plus full's master slices), the AdamW moments, the growth of its resident set
// from before the student existed to between steps and to its peak, and the step time. The peak is
// set against student_memory() for the same shapes, tokens and mode, less a baseline measured the
// same way per mode on a model so small its own memory is a few hundred KB (1 layer, hidden 64,
// vocab 64, one 8-token sequence): what the first steps cost whatever the model (thread pools,
// MPI's shared-memory segments, the allocator), as bench/memory_check subtracts its baseline.
// Large blocks are mmapped (M_MMAP_THRESHOLD 1 MiB), so freed memory leaves the resident set.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/peak_memory.h"
#include "dist/comm_student_group.h"
#include "dist/communicator.h"
#include "dist/mpi_session.h"
#include "model/student.h"
#include "plan/memory_model.h"
#include "train/adamw.h"
#include "train/distill_loss.h"
#include "train/gradient_buckets.h"
#include "train/sharded_adamw.h"

namespace {

struct Shape {
  int64_t hidden = 512, layers = 12, intermediate = 1536, vocab = 4096, seq = 256, micro_batch = 2,
          micro_batches = 2;
};

constexpr int64_t kBucketBytes = int64_t{32} << 20;  // parallel.bucket_cap_mb's default

deepen::StudentSpec spec_of(const Shape& s) {
  deepen::StudentSpec spec;
  spec.decoder.hidden = s.hidden;
  spec.decoder.heads = s.hidden / 64;
  spec.decoder.kv_heads = std::max<int64_t>(1, s.hidden / 128);
  spec.decoder.head_dim = 64;
  spec.decoder.intermediate = s.intermediate;
  spec.decoder.cpu_kernels = deepen::CpuKernels::kAten;
  spec.decoder.recompute = deepen::Recompute::kLayer;
  spec.vocab_size = s.vocab;
  spec.max_depth = s.layers;
  spec.tie_embeddings = false;
  return spec;
}

deepen::StudentMemory predicted(const Shape& s, deepen::Sharding sharding, int students) {
  const deepen::StudentSpec spec = spec_of(s);
  deepen::StudentMemoryInput in;
  in.student = {"bench", s.layers, s.hidden, spec.decoder.heads, spec.decoder.kv_heads, 64, s.intermediate, s.vocab, false};
  in.tokens = s.micro_batch * s.seq;
  in.precision = deepen::StudentPrecision::kFp32;
  in.recompute = deepen::Recompute::kLayer;
  in.sharding = sharding;
  in.students = students;
  in.bucket_bytes = static_cast<double>(kBucketBytes);
  in.closed_form_norms = true;  // fp32 on CPU, op-sequence kernels
  return deepen::student_memory(in);
}

int worker(const deepen::MpiSession& mpi, const Shape& shape, deepen::Sharding sharding, int steps) {
  using namespace deepen;
  at::set_num_threads(1);
  auto world = make_mpi_communicator(mpi);
  std::vector<int> ranks(world->size());
  for (int r = 0; r < world->size(); ++r) ranks[r] = r;
  CommStudentGroup group(*world, ranks);
  const AdamWOptions options{.weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  world->barrier();
  const int64_t rss0 = bench::status_bytes("VmRSS");
  bench::reset_peak_rss();

  GrowableStudent student(spec_of(shape), shape.layers, 7);
  std::optional<AdamW> replicated;
  std::optional<GradientBuckets> all_reduce;
  std::optional<ShardedAdamW> sharded;
  const auto params = student.named_trainable_parameters();
  if (sharding == Sharding::kNone) {
    replicated.emplace(options);
    std::vector<at::Tensor> tensors;
    std::vector<int64_t> numels;
    for (const auto& [name, p] : params) {
      replicated->add(name, p);
      tensors.push_back(p);
      numels.push_back(p.numel());
    }
    all_reduce.emplace(group, GradientBuckets::Mode::kAverage);
    all_reduce->set_parameters(tensors, make_shard_layout(numels, 1, bucket_elements(kBucketBytes, 4)));
  } else {
    const bool full = sharding == Sharding::kFull;
    sharded.emplace(options, group, kBucketBytes, full ? ShardedAdamW::Mode::kFull : ShardedAdamW::Mode::kGradOp);
    std::vector<int64_t> units;
    for (const auto& [name, p] : params) units.push_back(block_of_parameter(name));
    sharded->set_parameters(params, units);
    if (full) student.set_block_gate(&*sharded);
  }
  const bool full = sharded && sharded->mode() == ShardedAdamW::Mode::kFull;

  DistillLossOptions loss_options;
  loss_options.alpha = 0.0;  // CE on the labels only, chunked as in training
  double seconds = 0;
  int64_t between_rss = 0, param_bytes = 0;
  for (int step = 0; step < steps; ++step) {
    world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t m = 0; m < shape.micro_batches; ++m) {
      const at::Tensor ids = at::randint(shape.vocab, {shape.micro_batch, shape.seq + 1},
                                         at::detail::createCPUGenerator(1000 * (step + 1) + 10 * world->rank() + m),
                                         at::kLong);
      // As the trainer (parallel.overlap_grad_reduce = true): buckets go from inside the backward,
      // the last micro-batch's (every micro-batch's under full).
      if (full || m + 1 == shape.micro_batches) {
        if (sharded) sharded->arm_reduction();
        else all_reduce->arm();
      }
      const at::Tensor hidden = student.forward_hidden(ids.narrow(1, 0, shape.seq));
      const DistillLoss l = distill_loss(hidden, student.head_weight(), TeacherTargets::none(),
                                         ids.narrow(1, 1, shape.seq), loss_options);
      (l.loss / static_cast<double>(shape.micro_batches)).backward();
      if (full) sharded->accumulate_reduction();
    }
    if (sharded) {
      const double norm = sharded->reduce_gradients();
      sharded->update(1e-4, 1.0, norm);
      sharded->gather_parameters();
    } else {
      all_reduce->finish();
      replicated->step(1e-4);
      replicated->zero_grad();
    }
    seconds += bench::seconds_since(t0);
    between_rss = bench::status_bytes("VmRSS") - rss0;
  }
  if (sharded) {
    param_bytes = sharded->parameter_bytes();
    for (const auto& item : student.named_parameters())  // what the optimizer does not hold (frozen: none here)
      if (!item.value().requires_grad()) param_bytes += static_cast<int64_t>(item.value().nbytes());
  } else {
    for (const auto& item : student.named_parameters()) param_bytes += static_cast<int64_t>(item.value().nbytes());
  }
  int64_t state_bytes = 0;
  if (sharded) state_bytes = sharded->state_bytes();
  else
    for (const auto& [name, t] : replicated->state_tensors()) state_bytes += static_cast<int64_t>(t.nbytes());
  const nlohmann::json result = {{"rank", world->rank()},
                                 {"param_bytes", param_bytes},
                                 {"state_bytes", state_bytes},
                                 {"rss_growth", between_rss},
                                 {"peak_growth", bench::status_bytes("VmHWM") - rss0},
                                 {"step_s", seconds / steps}};
  std::cout << "RESULT " << result.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // freed large blocks go back to the OS: RSS shows what is held
  CLI::App app{"Memory per student rank of training steps: parallel.sharding none / grad_op / full"};
  Shape shape;
  int students = 2, steps = 2;
  bool is_worker = false;
  std::string sharding = "none";
  app.add_option("--students", students, "student ranks (mpirun -np)");
  app.add_option("--hidden", shape.hidden);
  app.add_option("--layers", shape.layers);
  app.add_option("--intermediate", shape.intermediate);
  app.add_option("--vocab", shape.vocab);
  app.add_option("--seq", shape.seq);
  app.add_option("--micro-batch", shape.micro_batch);
  app.add_option("--micro-batches", shape.micro_batches);
  app.add_option("--steps", steps);
  app.add_flag("--worker", is_worker, "internal: one rank of a variant under mpirun");
  app.add_option("--sharding", sharding)->check(CLI::IsMember({"none", "grad_op", "full"}));
  CLI11_PARSE(app, argc, argv);
  if (is_worker) {
    deepen::MpiSession mpi(&argc, &argv);
    return worker(mpi, shape, deepen::parse_option<deepen::Sharding>(sharding, "--sharding"), steps);
  }
  auto args_of = [&](const Shape& sh) {
    std::string args;
    for (const auto& [flag, v] : std::vector<std::pair<std::string, int64_t>>{
             {"--hidden", sh.hidden}, {"--layers", sh.layers}, {"--intermediate", sh.intermediate},
             {"--vocab", sh.vocab}, {"--seq", sh.seq}, {"--micro-batch", sh.micro_batch},
             {"--micro-batches", sh.micro_batches}, {"--steps", steps}})
      args += " " + flag + " " + std::to_string(v);
    return args;
  };
  const Shape tiny{.hidden = 64, .layers = 1, .intermediate = 64, .vocab = 64, .seq = 8, .micro_batch = 1,
                   .micro_batches = shape.micro_batches};
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::vector<std::string> modes = {"none", "grad_op", "full"};
  std::vector<std::vector<nlohmann::json>> results;
  std::vector<double> baseline;
  for (const auto& mode : modes) {
    results.push_back(deepen::bench::run_mpi_variant(self, students, "--worker --sharding " + mode + args_of(shape)));
    baseline.push_back(deepen::bench::max_over_ranks(
        deepen::bench::run_mpi_variant(self, students, "--worker --sharding " + mode + args_of(tiny)), "peak_growth"));
  }
  const deepen::StudentSpec spec = spec_of(shape);
  std::printf("%d student ranks (MPI, CPU), fp32 student: %lld layers, hidden %lld, %lld/%lld heads x 64, "
              "intermediate %lld, vocab %lld untied; %lld x %lld tokens per micro-batch, %lld micro-batches per "
              "step, recompute = layer, %d steps\n",
              students, static_cast<long long>(shape.layers), static_cast<long long>(shape.hidden),
              static_cast<long long>(spec.decoder.heads), static_cast<long long>(spec.decoder.kv_heads),
              static_cast<long long>(shape.intermediate), static_cast<long long>(shape.vocab),
              static_cast<long long>(shape.micro_batch), static_cast<long long>(shape.seq),
              static_cast<long long>(shape.micro_batches), steps);
  const double mib = 1 << 20;
  std::printf("%-38s %12s %12s %12s %9s %9s\n", "per rank (worst rank)", "none", "grad_op", "full", "grad/none",
              "full/none");
  auto row = [&](const char* what, const char* key, double scale, const char* unit) {
    double v[3];
    for (int i = 0; i < 3; ++i) v[i] = deepen::bench::max_over_ranks(results[static_cast<size_t>(i)], key) / scale;
    std::printf("%-38s %8.1f %s %8.1f %s %8.1f %s %9.3f %9.3f\n", what, v[0], unit, v[1], unit, v[2], unit, v[1] / v[0],
                v[2] / v[0]);
  };
  row("parameter values held between steps", "param_bytes", mib, "MiB");
  row("AdamW moments held", "state_bytes", mib, "MiB");
  row("resident set growth between steps", "rss_growth", mib, "MiB");
  row("peak resident set growth", "peak_growth", mib, "MiB");
  row("step time", "step_s", 1e-3, "ms ");
  std::printf("%-38s", "deepen plan's peak (student_memory)");
  double p[3];
  for (int i = 0; i < 3; ++i) {
    p[i] = predicted(shape, deepen::parse_option<deepen::Sharding>(modes[static_cast<size_t>(i)], "mode"), students).total() / mib;
    std::printf(" %8.1f MiB", p[i]);
  }
  std::printf("\n%-38s", "baseline (1-layer hidden-64 model)");
  for (int i = 0; i < 3; ++i) std::printf(" %8.1f MiB", baseline[static_cast<size_t>(i)] / mib);
  std::printf("\n%-38s", "(peak - baseline) / plan's peak");
  for (int i = 0; i < 3; ++i)
    std::printf(" %12.3f",
                (deepen::bench::max_over_ranks(results[static_cast<size_t>(i)], "peak_growth") - baseline[static_cast<size_t>(i)]) /
                    mib / p[i]);
  std::printf("\n");
  return 0;
}
