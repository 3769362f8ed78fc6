// Group files: the runs one shared-teacher job trains (`deepen group FILE`), as the study runner writes them.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace deepen {

// A group file (TOML), written by `deepen study` for each teacher group (study/teacher_groups.h):
//
//   [group]
//   name = "demo-g0"
//   out_dir = "runs/demo/study/groups/g0"   # the job's own records: teacher step times, secret
//
//   [[run]]
//   config = "configs/demo/base.toml"       # as `deepen train` takes it
//   set = ["student.norm=pre", "run.name=pre-grow", "run.out_dir=runs/demo/study/pre-grow/seed1"]
//
// Paths are taken from the working directory, as in configs (run.out_dir) and the study's list of
// jobs. Run r of the file is run r of the job: its students are the ranks RankLayout gives run r.
struct GroupRunSpec {
  std::string config;             // base config file
  std::vector<std::string> sets;  // --set overrides, in order
};

struct GroupSpec {
  std::string source;  // the file, for messages
  std::string name = "group";
  std::string out_dir;
  std::vector<GroupRunSpec> runs;
};

// Throws InputError naming the file and key (unknown keys, no runs, a run without config, no out_dir).
GroupSpec parse_group_file(const std::string& toml_text, const std::string& source);
GroupSpec load_group_file(const std::string& path);

// The file's text; parse_group_file reads it back to the same spec.
std::string group_file_text(const GroupSpec& group);

// Every run's config: its file, its sets, then `extra_sets` (the command line's --set, applied to
// every run). InputError naming the run's file and key.
std::vector<Config> load_group_configs(const GroupSpec& group, const std::vector<std::string>& extra_sets = {});

}  // namespace deepen
