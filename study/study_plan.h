// The study file (a base config + named runs × seeds) and its expansion into ordered jobs and
// teacher groups: pure decisions, shared by the local runner and the Slurm writer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "study/group_file.h"

namespace deepen {

// A study file (TOML), e.g. configs/demo/study.toml:
//
//   [study]
//   name = "demo"
//   base = "base.toml"          # the config every run starts from, relative to this file
//   out_dir = "runs/demo"       # runs land in <out_dir>/<run>/seed<k>; relative to the working
//                               # directory, like run.out_dir
//   seeds = [1, 2]
//   set = ["eval.every=10"]     # applied to every run, before the run's own overrides
//   launcher = "auto"           # "auto" | "mpirun" | "direct" (see use_mpirun)
//   command = "train"           # "train" | "pretrain": the deepen subcommand each run is
//   share_teacher = true        # runs whose teacher inputs are equal train in one job that pays
//                               # for one teacher pass (study/teacher_groups.h); needs mpirun
//   max_group_runs = 4          # at most this many runs per shared teacher (0 = no cap); the
//                               # channel sends each micro-batch to every run: `deepen plan --study`
//                               # prices each cap
//   teacher = "live"            # "live": each run's targets from a teacher of its own (or shared,
//                               # share_teacher) | "cache": the study first writes one teacher cache
//                               # (`deepen cache` of the base config with the study's `set`,
//                               # docs/cache.md), then every run trains from it with no teacher ranks
//                               # (distill.source = "cache"); every run must agree with the cache on
//                               # what it is keyed on (data, teacher, τ, cache.*)
//   cache_dir = "runs/x/cache"  # teacher = "cache": its folder (default <out_dir>/cache)
//   cache_parts = 8             # teacher = "cache", --slurm: the cache job is an array of this many
//                               # one-GPU tasks, each writing every cache_parts-th file
//   group_by = "order"          # "order" | "length": runs of equal length only share a teacher (a
//                               # group holds its devices for its longest run) | "listed": as the
//                               # [[group]] tables below say; `deepen plan --study` prices each and
//                               # prints the [[group]] tables of its cheapest grouping
//
//   [[group]]                   # runs that share one teacher (within each seed's data order);
//   runs = ["pre-grow", "post-grow"]   # a run in no [[group]] trains alone
//
//   [[run]]
//   name = "post-grow"
//   set = ["student.norm=post", "curriculum.mode=grow"]
//
//   [[run]]
//   name = "post-joint-matched"
//   set = ["student.norm=post", "curriculum.mode=joint", "curriculum.stages=[3]",
//          "curriculum.stage_steps=[]", "curriculum.budget=active_layer_tokens:post-grow"]
//   seeds = [1]                 # optional: a subset of seeds for this run
//
// A budget "active_layer_tokens:<name>" naming another run of the study is resolved to that run's
// folder for the same seed, and the run waits for it.
struct StudyRunSpec {
  std::string name;               // folder name, [A-Za-z0-9._-]+, unique in the study
  std::vector<std::string> sets;  // --set overrides, "section.key=value"
  std::vector<int64_t> seeds;     // empty: the study's seeds
};

struct StudySpec {
  std::string source;              // the study file, for messages
  std::string name = "study";
  std::string base;                // base config path (already resolved against the study file)
  std::string out_dir = "runs/study";
  std::vector<int64_t> seeds = {1};
  StudyCommand command = StudyCommand::kTrain;  // "train" | "pretrain"
  Launcher launcher = Launcher::kAuto;         // "auto" | "mpirun" | "direct"
  std::vector<std::string> sets;   // applied to every run first
  std::vector<StudyRunSpec> runs;  // in file order
  bool share_teacher = false;      // group runs that may share a teacher pass (train studies only)
  int64_t max_group_runs = 0;      // cap on a group's runs (0 = none)
  StudyTeacher teacher = StudyTeacher::kLive;  // "live" | "cache"
  std::string cache_dir;           // teacher = "cache": the cache folder ("" = <out_dir>/cache)
  int64_t cache_parts = 8;         // teacher = "cache": Slurm array tasks of the cache job
  GroupBy group_by = GroupBy::kOrder;  // "order" | "length" | "listed" (study/teacher_groups.h)
  std::vector<std::vector<std::string>> groups;  // [[group]] runs = [...] (group_by = "listed")
};

// Parses a study file; InputError names the file, the key and the reason (unknown keys, duplicate or
// malformed run names, no runs, no seeds, bad launcher/command).
StudySpec parse_study(const std::string& toml_text, const std::string& source);
StudySpec load_study(const std::string& path);

// One run × seed.
struct StudyJob {
  std::string run;                      // the study run's name
  int64_t seed = 1;
  std::string out_dir;                  // <study out_dir>/<run>/seed<seed>
  std::vector<std::string> overrides;   // every --set given to the child, in order
  std::vector<size_t> depends_on;       // indices into StudyPlan::jobs, all earlier than this job
  Config config;                        // the resolved, validated config of this job
  int64_t world_size = 1;               // T·P + S from [parallel]
  std::string id() const { return run + "/seed" + std::to_string(seed); }
};

// Runs that share one teacher pass: one job of T·P + R·S ranks (`deepen group`), or a lone run.
struct StudyGroup {
  std::vector<size_t> members;       // indices into StudyPlan::jobs, in order
  std::vector<std::string> refused;  // runs that could not join, with the reason (for --dry-run)
};

// The cache job of a study with teacher = "cache": `deepen cache <base> --set <overrides> --out <dir>`,
// before every run (each run gets distill.source = "cache" and cache.dir = <dir>).
struct StudyCacheJob {
  std::string dir;
  std::vector<std::string> overrides;  // the study's set, the command line's, then cache.dir
  Config config;                       // resolved
};

struct StudyPlan {
  StudySpec spec;
  std::optional<StudyCacheJob> cache;  // teacher = "cache"
  std::vector<StudyJob> jobs;  // in execution order: every job after the jobs it depends on
  // With share_teacher: the groups, in an order where each comes after the groups holding the runs
  // its members wait for; every job in exactly one group. Without: empty (every job alone).
  std::vector<StudyGroup> groups;
};

// Expands the study into jobs. Overrides are applied in this order: the study's `set`, the run's
// `set`, `extra_sets` (the command line's --set), then run.name, run.out_dir and run.seed; a budget
// override naming a study run is rewritten in place to name that run's folder. Every job's config is loaded and validated here, so a bad override fails before
// anything runs. Order: seed by seed, runs in file order, except that a job comes after the jobs it
// depends on (a stable topological order). `only` (run names; empty = all) keeps those runs.
// Throws InputError for an unknown run in `only`, a budget naming a run that lacks this seed, and a
// dependency cycle.
//
// Example: runs [post-joint-matched (budget → post-grow), pre-grow, post-grow], seeds [1, 2] gives
//   pre-grow/seed1, post-grow/seed1, post-joint-matched/seed1, pre-grow/seed2, post-grow/seed2,
//   post-joint-matched/seed2
// and post-joint-matched/seed1 gets curriculum.budget = "active_layer_tokens:<out>/post-grow/seed1".
StudyPlan expand_study(const StudySpec& spec, const std::vector<std::string>& extra_sets = {},
                       const std::vector<std::string>& only = {});

// The first setting a run from a study's teacher cache must share with the cache job's config and
// does not, as "key: value in the cache's config vs value in the run", or nullopt: data.tokenizer,
// data.train, data.valid, data.packing, data.seq_len (windows) or data.max_len (documents),
// teacher.checkpoint, teacher.dtype, distill.temperature, cache.samples, cache.seed,
// cache.train_sequences, cache.valid_sequences and, for cache.targets = "topk", cache.topk.
// Example: a run with --set distill.temperature=2 -> "distill.temperature: 1 vs 2".
std::optional<std::string> cache_share_difference(const Config& cache, const Config& run);

// The teacher groups of a plan's jobs (study/teacher_groups.h's group_for_teacher over the jobs in
// order). Example: the demo study with share_teacher and one seed: its eight runs read the same data
// in the same order with the same teacher: one group of eight, world = 1·2 + 8·2 = 18 ranks.
std::vector<StudyGroup> plan_teacher_groups(const std::vector<StudyJob>& jobs, size_t max_runs = 0,
                                            GroupBy by = GroupBy::kOrder,
                                            const std::vector<std::vector<std::string>>& listed = {});

// Ranks of a group's job: T·P + R·S from the first member's [parallel].
int64_t group_world_size(const StudyPlan& plan, const StudyGroup& group);

// Where a group's file and job records live: <out_dir>/groups/g<index>.
std::string group_dir(const StudyPlan& plan, size_t index);

// The group file `deepen group` reads for group `index` (its members that have not finished).
GroupSpec group_spec(const StudyPlan& plan, size_t index, const std::vector<size_t>& members);

// Whether a job runs under mpirun. "direct": never (one process plays every role; the trainer folds
// S students into gradient accumulation, same global batch); "mpirun": always; "auto": when the
// layout has more ranks than the trivial one teacher + one student (world > 2) and mpirun exists.
//   use_mpirun("auto", 4, true) -> true     use_mpirun("auto", 2, true) -> false
//   use_mpirun("auto", 4, false) -> false   use_mpirun("direct", 8, true) -> false
// "mpirun" without an mpirun is an InputError.
bool use_mpirun(Launcher launcher, int64_t world_size, bool mpirun_available);

// Ranks (Slurm tasks) of a job: world size under mpirun/srun, 1 when it runs as one process.
int64_t job_tasks(const StudyPlan& plan, const StudyJob& job);

// The units a study runs: its teacher groups, or every job alone when it shares no teacher.
std::vector<StudyGroup> study_units(const StudyPlan& plan);

// The run folder a job's budget reads ("active_layer_tokens:<folder>"), if it has one.
std::optional<std::string> budget_folder(const Config& cfg);

// A path made absolute and normal, for comparing run folders.
std::string normalized_path(const std::string& path);

}  // namespace deepen
