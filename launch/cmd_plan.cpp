// `deepen plan [CONFIG]`: predict teacher/student/channel rates and per-rank memory, and recommend T, P, S.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "data/token_shards.h"
#include "launch/command_line.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "plan/study_cost.h"
#include "study/study_plan.h"
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
  std::string study;
  std::vector<std::string> sets;
  std::string teacher;
  std::string cluster = "h200";
  std::optional<int64_t> nodes, gpus_per_node;
  std::optional<double> flops, mfu, teacher_mfu, intra_bw, inter_bw, memory;
  std::string device_memory;
  std::string calibrate;
  int64_t cores = 0, threads = 1;
  double p2p_bw = 5e9;
  double cache_tokens = 0;  // --study: the teacher cache's tokens (0: the training split, else the longest run)
  std::string layout;
  std::vector<std::string> check;
  size_t show = 8;
};

// Training tokens of a run: its curriculum's, or for a matched budget (a joint run given another
// run's active-layer tokens) that run's active-layer tokens over this run's depth.
double run_tokens(const PlanInput& in, const PlanInput* budget_from) {
  if (!budget_from) return in.total_tokens;
  double weight = 0, layer_weight = 0;
  for (size_t k = 0; k < budget_from->stage_tokens.size(); ++k) {
    weight += budget_from->stage_tokens[k];
    layer_weight += budget_from->stage_tokens[k] * static_cast<double>(budget_from->stage_depths.at(k));
  }
  const int64_t depth = in.stage_depths.empty() ? in.student.layers : in.stage_depths.back();
  return budget_from->total_tokens * layer_weight / weight / static_cast<double>(depth);
}

// The training split's tokens from its shard headers, or 0 when its shards are not there.
double split_tokens(const std::string& path) {
  double n = 0;
  try {
    for (const std::string& f : list_shard_files(path)) n += static_cast<double>(Shard::open(f).size());
  } catch (const InputError&) {
    return 0;
  }
  return n;
}

// study.teacher = "cache": the teacher once over the cache's tokens on study.cache_parts devices,
// then every run on its students alone; and the cache's size on disk.
void print_cache_cost(const StudyPlan& plan, const std::vector<PlanInput>& inputs, const std::vector<RunRates>& rates,
                      const ClusterSpec& c, double alone_device_hours, bool chosen, double given_tokens) {
  const Config& cfg = plan.jobs.front().config;
  const int64_t devices = plan.spec.cache_parts;
  const LayoutEstimate e = estimate_layout(inputs.front(), c, devices, 1, devices, RankOrder::kRoles);
  double longest = 0;
  for (const RunRates& r : rates) longest = std::max(longest, r.tokens);
  const double split = split_tokens(cfg.data.train);
  // cache.train_sequences = 0 caches the whole split: the runs' fresh documents (data orders by seed)
  // lie all over it. Without the shards here, the longest run's tokens: a lower bound.
  const double tokens = given_tokens > 0 ? given_tokens : cfg.cache.train_sequences == 0 && split > 0 ? split : longest;
  const char* source = given_tokens > 0                                  ? "--cache-tokens"
                       : cfg.cache.train_sequences == 0 && split > 0 ? "data.train, every token"
                                                                        : "the longest run's; the whole split when its shards are here";
  const CacheStudyCost cc = cache_study_cost(rates, tokens, e.teacher_tokens_per_s, devices);
  std::printf("a teacher cache (study.teacher = \"cache\"%s): the teacher once over %.4g tokens (%s) on %lld devices, "
              "%.1f job hours, %.0f device-hours; then each run on its students alone:\n"
              "                    %10.0f device-hours, %8.1f job hours (%.2f x a teacher per run)\n",
              chosen ? ", this study's" : "", tokens, source,
              static_cast<long long>(devices), cc.cache_job_hours, cc.cache_device_hours, cc.device_hours, cc.job_hours,
              cc.device_hours / alone_device_hours);
  const int64_t bound = cache_bytes_per_token_bound(cfg.cache.samples, cfg.cache.topk, inputs.front().teacher.vocab);
  std::printf("the cache on disk (cache.samples = %lld, cache.topk = %lld): at most %lld bytes/token (all K draws "
              "distinct), %.2f TB for %.4g tokens; a peaked teacher draws fewer distinct ids (docs/cache.md)\n",
              static_cast<long long>(cfg.cache.samples), static_cast<long long>(cfg.cache.topk),
              static_cast<long long>(bound), static_cast<double>(bound) * tokens / 1e12, tokens);
}

// `deepen plan --study FILE`: every run's layout rated as the config gives it, then the study's
// device-hours and job hours with a teacher per run and with the runs grouped to share one: the
// groups as the study forms them, the caps of study.max_group_runs in the study's order, and runs of
// equal length (study.group_by = "length") each group with the teacher pipelines that cost it least;
// then with a teacher cache (print_cache_cost).
void print_study_cost(const std::string& file, const std::vector<std::string>& sets, const ClusterSpec& c,
                      double cache_tokens) {
  StudySpec spec = load_study(file);
  const bool cached = spec.teacher == StudyTeacher::kCache;
  spec.teacher = StudyTeacher::kLive;  // rated with a teacher, shared and not, and then with a cache
  spec.share_teacher = true;
  if (spec.launcher == Launcher::kDirect) spec.launcher = Launcher::kAuto;
  const StudyPlan plan = expand_study(spec, sets);
  std::vector<PlanInput> inputs;
  for (const StudyJob& j : plan.jobs) inputs.push_back(plan_input_from_config(j.config));
  std::vector<RunRates> rates;
  std::printf("study %s: %zu runs, each rated on its own layout (%s: %lld nodes x %lld devices)\n", spec.name.c_str(),
              plan.jobs.size(), file.c_str(), static_cast<long long>(c.nodes), static_cast<long long>(c.gpus_per_node));
  std::printf("  %-28s %9s %12s %12s %12s %12s %10s\n", "run", "devices", "tokens", "teacher t/s", "students t/s",
              "alone t/s", "alone h");
  for (size_t k = 0; k < plan.jobs.size(); ++k) {
    const StudyJob& j = plan.jobs[k];
    const ParallelConfig& p = j.config.parallel;
    const LayoutEstimate e = estimate_layout(inputs[k], c, p.teacher_pipelines, p.teacher_stages, p.students, p.rank_order);
    // The students' demand over the curriculum, weighted like the job's mean.
    double weight = 0, time = 0;
    for (size_t s = 0; s < e.student_tokens_per_s.size(); ++s) {
      const double w = s < inputs[k].stage_tokens.size() ? inputs[k].stage_tokens[s] : 1.0;
      weight += w;
      time += w / e.student_tokens_per_s[s];
    }
    const PlanInput* budget_from =
        j.config.curriculum.budget.empty() || j.depends_on.empty() ? nullptr : &inputs.at(j.depends_on.front());
    RunRates r{j.id(), p.teacher_pipelines * p.teacher_stages, p.students, run_tokens(inputs[k], budget_from),
               e.teacher_tokens_per_s, e.channel_tokens_per_s, weight / time, e.mean_tokens_per_s, p.teacher_pipelines};
    if (!(r.tokens > 0)) throw InputError(j.id() + ": its curriculum gives no token count (stage_tokens or stage_steps)");
    // The most runs whose queues this run's teacher stage holds within 90% of a device (at least its
    // own: a run that does not fit alone is the memory section's finding, not the grouping's).
    r.max_shared_runs = 1;
    for (int64_t runs_held = 2; runs_held <= 64; ++runs_held) {
      PlanInput shared = inputs[k];
      shared.shared_runs = runs_held;
      if (planned_teacher_stage(shared, p.teacher_stages).total() > 0.9 * c.memory) break;
      r.max_shared_runs = runs_held;
    }
    std::printf("  %-28s %9lld %12.4g %12.4g %12.4g %12.4g %10.1f\n", r.id.c_str(),
                static_cast<long long>(r.teacher_devices + r.student_devices), r.tokens, r.teacher_tokens_per_s,
                r.student_tokens_per_s, r.alone_tokens_per_s, r.tokens / r.alone_tokens_per_s / 3600.0);
    rates.push_back(r);
  }
  auto members = [](const std::vector<StudyGroup>& groups) {
    std::vector<std::vector<size_t>> out;
    for (const StudyGroup& g : groups) out.push_back(g.members);
    return out;
  };
  // A group's line: its runs, pipelines, devices, pace and bound, hours, and its teacher's last stage
  // with one outgoing queue per run (the group's memory bound, dist/logit_channel.h).
  auto describe = [&](const std::vector<StudyGroup>& groups, const std::vector<int64_t>& pipelines) {
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::vector<size_t>& m = groups[g].members;
      const int64_t T = pipelines.empty() ? plan.jobs[m.front()].config.parallel.teacher_pipelines : pipelines[g];
      const GroupPrice price = price_group(rates, m, T);
      PlanInput in = inputs[m.front()];
      in.shared_runs = static_cast<int64_t>(m.size());
      const TeacherStageMemory t = planned_teacher_stage(in, plan.jobs[m.front()].config.parallel.teacher_stages);
      std::printf("  g%zu: %zu run%s, T=%lld, %lld devices, %.4g tokens/s (%s-bound), %.1f h, %.0f device-hours; "
                  "teacher stage %.1f GiB with %zu run%s' queues%s\n     ",
                  g, m.size(), m.size() == 1 ? "" : "s", static_cast<long long>(T), static_cast<long long>(price.devices),
                  price.tokens_per_s, price.bound.c_str(), price.hours, price.device_hours,
                  t.total() / (1024.0 * 1024.0 * 1024.0), m.size(), m.size() == 1 ? "" : "s",
                  t.total() > 0.9 * c.memory ? " (does NOT fit)" : "");
      for (size_t k : m) std::printf(" %s", plan.jobs[k].id().c_str());
      std::printf("\n");
    }
  };
  const StudyCost cost = study_cost(rates, members(plan.groups));
  std::printf("the study's teacher groups (study.group_by = \"%s\", max_group_runs = %lld):\n",
              option_name(spec.group_by), static_cast<long long>(spec.max_group_runs));
  describe(plan.groups, {});
  std::printf("a teacher per run:  %10.0f device-hours, %8.1f job hours (jobs one after another)\n",
              cost.alone_device_hours, cost.alone_job_hours);
  std::printf("these groups:       %10.0f device-hours, %8.1f job hours (%.2f x the device-hours)\n",
              cost.shared_device_hours, cost.shared_job_hours, cost.shared_device_hours / cost.alone_device_hours);
  // A group moves at its slowest run and its channel carries every run's copy: a cap may be cheaper.
  size_t largest = 0;
  for (const StudyGroup& g : plan_teacher_groups(plan.jobs)) largest = std::max(largest, g.members.size());
  std::printf("by study.max_group_runs (group_by = \"order\": groups in the study's order):\n");
  size_t best_cap = 1;
  double best_order = INFINITY;
  for (size_t cap = 1; cap <= largest; ++cap) {
    const StudyCost c2 = study_cost(rates, members(plan_teacher_groups(plan.jobs, cap)));
    if (c2.shared_device_hours < best_order) best_order = c2.shared_device_hours, best_cap = cap;
    std::printf("  %3zu: %10.0f device-hours (%.2f x), %8.1f job hours\n", cap, c2.shared_device_hours,
                c2.shared_device_hours / cost.alone_device_hours, c2.shared_job_hours);
  }
  // Runs of equal length share: no group holds devices for a longer run than its own. Each group then
  // takes the teacher pipelines that cost it least (enough that the teacher does not bound it); a
  // cap on the group's runs may still pay where R copies make the channel the bound.
  std::printf("by length (group_by = \"length\"), each group with its cheapest teacher pipelines, by max_group_runs:\n");
  struct LengthChoice {
    size_t cap = 0;
    std::vector<StudyGroup> groups;
    std::vector<int64_t> pipelines;
    StudyCost cost;
  };
  std::optional<LengthChoice> best_length;
  for (size_t cap = 0; cap <= largest; ++cap) {
    LengthChoice choice{cap, plan_teacher_groups(plan.jobs, cap, GroupBy::kLength), {}, {}};
    for (const StudyGroup& g : choice.groups) choice.pipelines.push_back(cheapest_pipelines(rates, g.members));
    choice.cost = study_cost(rates, members(choice.groups), choice.pipelines);
    std::printf("  %3zu: %10.0f device-hours (%.2f x), %8.1f job hours%s\n", cap, choice.cost.shared_device_hours,
                choice.cost.shared_device_hours / cost.alone_device_hours, choice.cost.shared_job_hours,
                cap == 0 ? " (no cap)" : "");
    if (!best_length || choice.cost.shared_device_hours < best_length->cost.shared_device_hours * (1 - 1e-9))
      best_length = std::move(choice);
  }
  // The cheapest cut of each class of runs that may share (one seed's data order; a run that waits
  // for another in a later class): sorted by length, consecutive groups (plan/study_cost.h).
  std::vector<std::vector<size_t>> classes;
  for (const StudyGroup& g : plan_teacher_groups(plan.jobs)) classes.push_back(g.members);
  std::vector<StudyGroup> cheapest;
  for (std::vector<size_t>& g : cheapest_groups(rates, classes))
    cheapest.push_back(StudyGroup{std::move(g), {}});
  std::vector<int64_t> cheapest_t;
  for (const StudyGroup& g : cheapest) cheapest_t.push_back(cheapest_pipelines(rates, g.members));
  const StudyCost listed = study_cost(rates, members(cheapest), cheapest_t);
  std::printf("the cheapest groups (runs sorted by length, a shorter run joining a longer group where its idle "
              "students cost less than a teacher of its own):\n");
  describe(cheapest, cheapest_t);
  std::printf("  %10.0f device-hours (%.2f x), %8.1f job hours\n", listed.shared_device_hours,
              listed.shared_device_hours / cost.alone_device_hours, listed.shared_job_hours);
  const double fewest = std::min({best_order, best_length->cost.shared_device_hours, listed.shared_device_hours});
  if (fewest == listed.shared_device_hours) {
    // The study file's lines for these groups: each seed's groups name the same runs.
    std::printf("fewest device-hours: these groups, %.0f device-hours (%.2f x a teacher per run); in the study file:\n",
                listed.shared_device_hours, listed.shared_device_hours / cost.alone_device_hours);
    std::set<std::vector<std::string>> said;
    for (size_t g = 0; g < cheapest.size(); ++g) {
      std::vector<std::string> names;
      for (size_t k : cheapest[g].members) names.push_back(plan.jobs[k].run);
      if (names.size() < 2 || !said.insert(names).second) continue;
      std::printf("  [[group]]\n  runs = [");
      for (size_t i = 0; i < names.size(); ++i) std::printf("%s\"%s\"", i ? ", " : "", names[i].c_str());
      std::printf("]\n");
      const int64_t T0 = plan.jobs[cheapest[g].members.front()].config.parallel.teacher_pipelines;
      if (cheapest_t[g] != T0)
        std::printf("  # and parallel.teacher_pipelines = %lld in these runs' set lists\n", static_cast<long long>(cheapest_t[g]));
    }
  } else if (fewest == best_length->cost.shared_device_hours) {
    std::printf("fewest device-hours: study.group_by = \"length\", max_group_runs = %zu (%.2f x a teacher per run)\n",
                best_length->cap, fewest / cost.alone_device_hours);
  } else {
    std::printf("fewest device-hours: study.group_by = \"order\", max_group_runs = %zu (%.2f x a teacher per run)\n",
                best_cap, best_order / cost.alone_device_hours);
  }
  print_cache_cost(plan, inputs, rates, c, cost.alone_device_hours, cached, cache_tokens);
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanCommand>();
  CLI::App* cmd = app.add_subcommand("plan", "cost model: teacher/student/logit-channel rates and the T, P, S to use");
  cmd->add_option("config", o->config, "deepen config (student, teacher, batch, curriculum); default: the paper's setup");
  cmd->add_option("--set", o->sets, "override a config key: section.key=value")->take_all();
  cmd->add_option("--cache-tokens", o->cache_tokens,
                  "--study: the tokens a teacher cache would hold (default: data.train's, else the longest run's)");
  cmd->add_option("--study", o->study,
                  "a study file: device-hours and job hours of its runs with a teacher each and sharing one "
                  "(study.share_teacher); --set applies to every run");
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
    if (!o->study.empty()) {
      print_study_cost(o->study, o->sets, c, o->cache_tokens);
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
