// Optimizer memory per student rank, replicated vs sharded (parallel.sharding = "grad_op"), on real
// MPI ranks: the same Qwen3-shaped parameters and gradients, the trainer's two optimizers.
//
//   build/bench/sharded_optimizer_bench [--students 4] [--hidden 768] [--layers 8]
//                                       [--intermediate 2048] [--vocab 32768] [--steps 2]
//
// Run without mpirun: the driver starts `mpirun -np S <this> --worker --sharding none|grad_op` once
// per variant, so each variant's ranks start clean, and prints both side by side. Each rank
// reports the growth of its resident set from before the optimizer exists to after `steps` steps,
// gradients made again as the next backward would (the moments and whatever the step keeps), the growth of its peak during the steps (the step's
// temporaries too: buckets, shards), the optimizer's own count of moment bytes, and the step time.
// Large blocks are mmapped (M_MMAP_THRESHOLD 1 MiB), so freed temporaries leave the resident set.
// Replicated = every student's AdamW state whole + CommStudentGroup::average's bucketed all-reduce
// (the trainer's replicated step posts the same all-reduces per bucket, from train/gradient_buckets.h).
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/peak_memory.h"
#include "dist/comm_student_group.h"
#include "dist/communicator.h"
#include "dist/mpi_session.h"
#include "train/adamw.h"
#include "train/sharded_adamw.h"

namespace {

struct Shape {
  int64_t hidden = 768, layers = 8, intermediate = 2048, vocab = 32768;
};

// A Qwen3 student's trainable parameters (GQA with head_dim 64, kv heads = heads / 2, QK-norm,
// untied head), in the trainer's order.
std::vector<std::pair<std::string, at::Tensor>> make_params(const Shape& s) {
  const int64_t heads = s.hidden / 64, kv = std::max<int64_t>(1, heads / 2), d = 64;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"embed", {s.vocab, s.hidden}}};
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    shapes.push_back({b + "attn_norm", {s.hidden}});
    shapes.push_back({b + "q", {heads * d, s.hidden}});
    shapes.push_back({b + "k", {kv * d, s.hidden}});
    shapes.push_back({b + "v", {kv * d, s.hidden}});
    shapes.push_back({b + "q_norm", {d}});
    shapes.push_back({b + "k_norm", {d}});
    shapes.push_back({b + "o", {s.hidden, heads * d}});
    shapes.push_back({b + "mlp_norm", {s.hidden}});
    shapes.push_back({b + "gate", {s.intermediate, s.hidden}});
    shapes.push_back({b + "up", {s.intermediate, s.hidden}});
    shapes.push_back({b + "down", {s.hidden, s.intermediate}});
  }
  shapes.push_back({"final_norm", {s.hidden}});
  shapes.push_back({"head", {s.vocab, s.hidden}});
  std::vector<std::pair<std::string, at::Tensor>> out;
  uint64_t seed = 1;
  for (const auto& [name, shape] : shapes)
    out.emplace_back(name, (at::randn(shape, at::detail::createCPUGenerator(seed++)) * 0.02).requires_grad_(true));
  return out;
}

int worker(const deepen::MpiSession& mpi, const Shape& shape, deepen::Sharding sharding, int steps) {
  using namespace deepen;
  at::set_num_threads(1);
  auto world = make_mpi_communicator(mpi);
  std::vector<int> ranks(world->size());
  for (int r = 0; r < world->size(); ++r) ranks[r] = r;
  CommStudentGroup group(*world, ranks);
  const auto params = make_params(shape);
  int64_t numel = 0;
  for (const auto& [n, p] : params) numel += p.numel();
  auto set_grads = [&](int step) {
    uint64_t seed = 1000 + 100 * static_cast<uint64_t>(world->rank()) + static_cast<uint64_t>(step);
    for (const auto& [n, p] : params) p.mutable_grad() = at::randn(p.sizes(), at::detail::createCPUGenerator(seed++));
  };
  set_grads(0);
  const AdamWOptions options{.weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  world->barrier();
  const int64_t rss0 = bench::status_bytes("VmRSS");
  bench::reset_peak_rss();
  std::optional<AdamW> replicated;
  std::optional<ShardedAdamW> sharded;
  double seconds = 0;
  int64_t state_bytes = 0;
  if (sharding == deepen::Sharding::kGradOp) {
    sharded.emplace(options, group, int64_t{32} << 20);
    sharded->set_parameters(params);
  } else {
    replicated.emplace(options);
    for (const auto& [n, p] : params) replicated->add(n, p);
  }
  for (int step = 0; step < steps; ++step) {
    if (step > 0) set_grads(step);
    world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (sharded) {
      const double norm = sharded->reduce_gradients();
      sharded->update(1e-3, 1.0, norm);
      sharded->gather_parameters();
    } else {
      std::vector<at::Tensor> grads;
      for (const auto& [n, p] : params) grads.push_back(p.grad());
      group.average(grads);
      replicated->step(1e-3);
      replicated->zero_grad();
    }
    seconds += bench::seconds_since(t0);
  }
  // Both variants drop the gradients in the step (zero_grad / the reduce-scatter); a trainer makes
  // them again in the next backward, so they are made again here before measuring: the growth is
  // then what the optimizer holds between steps.
  set_grads(steps);
  const int64_t rss1 = bench::status_bytes("VmRSS"), hwm = bench::status_bytes("VmHWM");
  if (sharded) state_bytes = sharded->state_bytes();
  else
    for (const auto& [name, t] : replicated->state_tensors()) state_bytes += static_cast<int64_t>(t.nbytes());
  const nlohmann::json result = {{"rank", world->rank()},        {"params", numel},
                                 {"rss_growth", rss1 - rss0},    {"peak_growth", hwm - rss0},
                                 {"state_bytes", state_bytes},   {"step_s", seconds / steps}};
  std::cout << "RESULT " << result.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // freed large blocks go back to the OS: RSS shows what is held
  CLI::App app{"Optimizer memory per student rank: replicated vs sharded (grad_op)"};
  Shape shape;
  int students = 4, steps = 2;
  bool is_worker = false;
  std::string sharding = "none";
  app.add_option("--students", students, "student ranks (mpirun -np)");
  app.add_option("--hidden", shape.hidden);
  app.add_option("--layers", shape.layers);
  app.add_option("--intermediate", shape.intermediate);
  app.add_option("--vocab", shape.vocab);
  app.add_option("--steps", steps);
  app.add_flag("--worker", is_worker, "internal: one rank of a variant under mpirun");
  app.add_option("--sharding", sharding)->check(CLI::IsMember({"none", "grad_op"}));
  CLI11_PARSE(app, argc, argv);
  if (is_worker) {
    deepen::MpiSession mpi(&argc, &argv);
    return worker(mpi, shape, deepen::parse_option<deepen::Sharding>(sharding, "--sharding"), steps);
  }
  const std::vector<std::string> shape_args = {
      "--hidden " + std::to_string(shape.hidden), "--layers " + std::to_string(shape.layers),
      "--intermediate " + std::to_string(shape.intermediate), "--vocab " + std::to_string(shape.vocab),
      "--steps " + std::to_string(steps)};
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string args;
  for (const auto& a : shape_args) args += " " + a;
  const auto rep = deepen::bench::run_mpi_variant(self, students, "--worker --sharding none" + args);
  const auto sh = deepen::bench::run_mpi_variant(self, students, "--worker --sharding grad_op" + args);
  const double mib = 1 << 20;
  const double params = rep[0]["params"].get<double>();
  std::printf("%d student ranks (MPI, CPU), %.1f M fp32 parameters (hidden %lld, %lld layers, intermediate %lld, "
              "vocab %lld), %d steps\n", students, params / 1e6, static_cast<long long>(shape.hidden),
              static_cast<long long>(shape.layers), static_cast<long long>(shape.intermediate),
              static_cast<long long>(shape.vocab), steps);
  std::printf("%-34s %12s %12s %9s\n", "per rank (worst rank)", "replicated", "sharded", "ratio");
  auto row = [&](const char* what, const char* key, double scale, const char* unit) {
    const double a = deepen::bench::max_over_ranks(rep, key) / scale, b = deepen::bench::max_over_ranks(sh, key) / scale;
    std::printf("%-34s %9.1f %s %9.1f %s %8.3f\n", what, a, unit, b, unit, b / a);
  };
  row("moments held (optimizer's count)", "state_bytes", mib, "MiB");
  row("resident set growth after steps", "rss_growth", mib, "MiB");
  row("peak growth during steps", "peak_growth", mib, "MiB");
  row("step time", "step_s", 1e-3, "ms ");
  std::printf("1/S = %.3f; moments of the whole model = %.1f MiB\n", 1.0 / students, 8 * params / mib);
  return 0;
}
