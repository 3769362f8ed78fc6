// Studies: a base config + named runs (override lists) × seeds, expanded into run folders, ordered by
// dependency, run in sequence as child processes, or written out as a Slurm array.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "run_folder/progress.h"
#include "child_process/child_process.h"
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

struct StudyPlan {
  StudySpec spec;
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

// The teacher groups of a plan's jobs (study/teacher_groups.h's group_for_teacher over the jobs in
// order). Example: the demo study with share_teacher and one seed: its eight runs read the same data
// in the same order with the same teacher: one group of eight, world = 1·2 + 8·2 = 18 ranks.
std::vector<StudyGroup> plan_teacher_groups(const std::vector<StudyJob>& jobs, size_t max_runs = 0);

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

// The child process of a job: `<deepen> <command> <base> --set ... --quiet?`, wrapped in
// `mpirun --oversubscribe -np <world>` when use_mpirun says so; as root, the OMPI_ALLOW_RUN_AS_ROOT
// pair is added to the environment (Open MPI refuses root otherwise).
struct LaunchContext {
  std::string deepen_exe;   // this binary
  std::string mpirun;       // its path, or "" when there is none
  bool is_root = false;
  bool quiet = false;       // pass --quiet to the runs (no per-step lines)
  // Each run's output goes to <out_dir>/train.log and one progress line per run is kept up to date
  // from its records instead (the demo's view); a failed run's log tail is printed.
  bool log_runs = false;
};

// The last `n` lines of a text file ("" if missing).
std::string tail_lines(const std::string& path, size_t n);
ProcessSpec job_process(const StudyPlan& plan, const StudyJob& job, const LaunchContext& ctx);

// The plan as the user sees it before anything runs: one line per job with its layout, curriculum,
// dependency and state on disk, then the order.
std::string describe_plan(const StudyPlan& plan, const LaunchContext& ctx);

// Runs every job in order, skipping finished ones. A job whose dependency failed is skipped. Returns
// the exit code for the study: 0 all finished, 3 a run stopped for requeue (the study stops there;
// rerunning the study resumes it), 2 some run had bad input, 1 some run failed.
int run_study(const StudyPlan& plan, const LaunchContext& ctx);

// ---- Slurm ---------------------------------------------------------------------------------------
// A study on Slurm reuses slurm/study_array.sbatch (rank map, control-plane secret, SIGUSR1 ->
// checkpoint -> exit 3 -> requeue): `deepen study --slurm DIR` writes
//   DIR/study.list  one line per job, "CONFIG --set k=v ... --quiet" (array index = line number,
//                   counting from 0), read by study_array.sbatch
//   DIR/submit.sh   submits the jobs that have not finished: independent jobs as one array per task
//                   count, each dependent job (a matched run) as its own array element with
//                   --dependency=afterok:<job>_<index> on exactly the element it needs (or none when
//                   that run finished already). With share_teacher a job is a teacher group: one
//                   allocation of T·P + R·S tasks for its R runs (DIR/groups/), finished when all are
//   DIR/logs/       the tasks' output
struct SlurmOptions {
  std::string deepen_exe;       // absolute path of deepen on the cluster (default: this binary)
  std::string deepen_home;      // the checkout holding slurm/study_array.sbatch
  std::string workdir;          // where runs start (relative paths in configs resolve here)
  int64_t gpus_per_node = 8;
  int64_t cpus_per_task = 8;
  std::string partition;        // "" = the cluster's default
  std::string account;          // "" = none
  std::string time = "24:00:00";
};

struct SlurmScripts {
  std::string study_list;
  std::string submit_sh;
  // With share_teacher: groups/g<k>.toml under DIR for each teacher group of several runs, whose line
  // in study.list is "group <DIR>/groups/g<k>.toml --quiet" (slurm/lib.sh: deepen_run_job group ...)
  // and whose array element asks for T·P + R·S tasks.
  std::vector<std::pair<std::string, std::string>> group_files;  // (path under DIR, text)
};
// InputError when an override holds whitespace inside a quoted value (the list is split on
// whitespace); whitespace elsewhere ("curriculum.stages=[1, 2]") is removed.
SlurmScripts slurm_scripts(const StudyPlan& plan, const SlurmOptions& options, const std::string& dir);
// Writes them into `dir` (created, with logs/), submit.sh executable.
void write_slurm_study(const StudyPlan& plan, const SlurmOptions& options, const std::string& dir);

// The checkout that holds slurm/study_array.sbatch: `<exe>/../..` when the binary is in a build
// folder of the checkout, else the working directory if it holds slurm/, else "".
std::string find_deepen_home(const std::string& deepen_exe);

// Ranks (Slurm tasks) of a job: world size under mpirun/srun, 1 when it runs as one process.
int64_t job_tasks(const StudyPlan& plan, const StudyJob& job);

}  // namespace deepen
