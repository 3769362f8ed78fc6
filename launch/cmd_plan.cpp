// `deepen plan [CONFIG]`: predict teacher/student/channel rates and per-rank memory, and recommend T, P, S.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "launch/command_line.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace {

// Without a config: the paper's student (9 layers, hidden 1024) growing one block per stage with
// equal stage budgets, a Qwen3-8B teacher, top-64 bf16 logits. Everything can be --set.
const char* kPlanDefaults = R"(
[teacher]
checkpoint = "Qwen3-8B"
[data]
seq_len = 4096
[student]
layers = 9
[curriculum]
mode = "grow"
stage_tokens = ["1", "1", "1", "1", "1", "1", "1", "1", "1"]
[distill]
logits = "topk"
topk = 64
channel_dtype = "bf16"
[parallel]
micro_batch = 4
activation_dtype = "bf16"
)";

struct PlanCommand {
  std::string config;
  std::vector<std::string> sets;
  std::string teacher;
  std::string cluster = "h200";
  std::optional<int64_t> nodes, gpus_per_node;
  std::optional<double> flops, mfu, teacher_mfu, intra_bw, inter_bw, memory;
  std::string device_memory;
  std::string calibrate;
  int64_t cores = 0, threads = 1;
  double p2p_bw = 5e9;
  std::string layout;
  std::vector<std::string> check;
  size_t show = 8;
};

}  // namespace

void register_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanCommand>();
  CLI::App* cmd = app.add_subcommand("plan", "cost model: teacher/student/logit-channel rates and the T, P, S to use");
  cmd->add_option("config", o->config, "deepen config (student, teacher, batch, curriculum); default: the paper's setup");
  cmd->add_option("--set", o->sets, "override a config key: section.key=value")->take_all();
  cmd->add_option("--teacher", o->teacher, "teacher: a Hugging Face folder or a Qwen3 name (qwen3-8b, qwen3-1.7b, ...)");
  cmd->add_option("--cluster", o->cluster, "preset: h200 | h100 | a100")->capture_default_str();
  cmd->add_option("--nodes", o->nodes, "nodes");
  cmd->add_option("--gpus-per-node", o->gpus_per_node, "devices per node");
  cmd->add_option("--gpu-flops", o->flops, "peak dense bf16 FLOP/s per device");
  cmd->add_option("--mfu", o->mfu, "achieved fraction of peak for student training (assumption)");
  cmd->add_option("--teacher-mfu", o->teacher_mfu, "achieved fraction of peak for the teacher forward (assumption)");
  cmd->add_option("--intra-bw", o->intra_bw, "bytes/s per device within a node");
  cmd->add_option("--inter-bw", o->inter_bw, "bytes/s per device between nodes");
  cmd->add_option("--gpu-mem", o->memory, "bytes of memory per device");
  cmd->add_option("--device-memory", o->device_memory,
                  "memory per device with a unit (80GiB, 80GB, 141e9): each rank's peak must fit in 90% of it");
  cmd->add_option("--calibrate", o->calibrate,
                  "CPU: calibrate on this single-process run folder (its metrics.jsonl) instead of a cluster preset");
  cmd->add_option("--cores", o->cores, "CPU: cores shared by the ranks (default: this machine's)");
  cmd->add_option("--threads", o->threads, "CPU: threads per rank of the predicted layouts")->capture_default_str();
  cmd->add_option("--p2p-bw", o->p2p_bw, "CPU: bytes/s between ranks (MPI shared memory)")->capture_default_str();
  cmd->add_option("--layout", o->layout,
                  "only this layout, as T,P,S (e.g. 1,2,2), in parallel.rank_order's order (--set parallel.rank_order=pipelines)");
  cmd->add_option("--show", o->show, "layouts to list")->capture_default_str();
  cmd->add_option("--check", o->check, "with --calibrate: compare the model with these measured run folders")->take_all();
  cmd->callback([o] {
    std::vector<std::string> sets = o->sets;
    if (!o->teacher.empty()) sets.push_back("teacher.checkpoint=\"" + o->teacher + "\"");
    const Config cfg = o->config.empty() ? parse_config(kPlanDefaults, "<plan defaults>", sets) : load_config(o->config, sets);
    const PlanInput in = plan_input_from_config(cfg);
    long long T = cfg.parallel.teacher_pipelines, P = cfg.parallel.teacher_stages, S = cfg.parallel.students;
    if (!o->layout.empty() &&
        (std::sscanf(o->layout.c_str(), "%lld,%lld,%lld", &T, &P, &S) != 3 || T < 1 || P < 1 || S < 1 || S % T))
      throw InputError("--layout " + o->layout + ": expected T,P,S with S a multiple of T");
    ClusterSpec c;
    if (!o->calibrate.empty()) {
      const int64_t cores = o->cores > 0 ? o->cores : std::max(1u, std::thread::hardware_concurrency());
      const int64_t ranks = T * P + S;
      // The calibration run's own shapes and threads set the FLOPs its measured rate stands for.
      const Config cal = load_config(RunFolder(o->calibrate).config_toml());
      const int64_t threads = cal.run.threads > 0 ? cal.run.threads : cores;
      c = calibrate_cpu(plan_input_from_config(cal), measured_tokens_per_s(o->calibrate), threads, cores, ranks, o->p2p_bw);
      c.threads_per_rank = o->threads;
    } else {
      c = cluster_preset(o->cluster);
    }
    if (o->nodes) c.nodes = *o->nodes;
    if (o->gpus_per_node) c.gpus_per_node = *o->gpus_per_node;
    if (o->flops) c.flops = *o->flops;
    if (o->mfu) c.mfu = *o->mfu;
    if (o->teacher_mfu) c.teacher_mfu = *o->teacher_mfu;
    if (o->intra_bw) c.intra_bw = *o->intra_bw;
    if (o->inter_bw) c.inter_bw = *o->inter_bw;
    if (o->memory) c.memory = *o->memory;
    if (!o->device_memory.empty()) c.memory = parse_bytes(o->device_memory, "--device-memory");
    if (c.nodes < 1 || c.gpus_per_node < 1) throw InputError("--nodes and --gpus-per-node must be >= 1");
    if (!o->check.empty()) {
      if (o->calibrate.empty()) throw InputError("--check needs --calibrate RUN (a single-process run to calibrate on)");
      std::cout << "calibrated on " << o->calibrate << ": " << c.flops / 1e9 << " GFLOP/s per core, " << c.shared_cores
                << " cores\n" << describe_check(check_against_runs(c, o->check));
      return;
    }
    std::vector<LayoutEstimate> ranked;
    if (!o->layout.empty()) {
      ranked.push_back(estimate_layout(in, c, T, P, S, cfg.parallel.rank_order));
    } else {
      ranked = rank_layouts(in, c);
    }
    std::cout << describe_plan(in, c, ranked, o->show);
  });
}

}  // namespace deepen
