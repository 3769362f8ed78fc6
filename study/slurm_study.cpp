// The Slurm writer of a study: study.list, the teacher groups' files and submit.sh.
#include "study/slurm_study.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "child_process/child_process.h"
#include "config/input_error.h"
#include "config/toml_text.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;


namespace {

// "curriculum.stages=[1, 2]" -> "curriculum.stages=[1,2]": the run list is split on whitespace.
std::string without_spaces(const std::string& word, const std::string& where) {
  std::string out;
  bool in_string = false;
  for (char c : word) {
    if (c == '"') in_string = !in_string;
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_string)
        throw InputError(where + ": \"" + word + "\" has whitespace inside a quoted value, which the Slurm run list "
                         "cannot carry");
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string find_deepen_home(const std::string& deepen_exe) {
  const fs::path up = fs::path(deepen_exe).parent_path().parent_path();
  if (fs::exists(up / "slurm" / "study_array.sbatch")) return up.lexically_normal().string();
  if (fs::exists(fs::current_path() / "slurm" / "study_array.sbatch")) return fs::current_path().string();
  return "";
}

SlurmScripts slurm_scripts(const StudyPlan& plan, const SlurmOptions& o, const std::string& dir) {
  if (o.gpus_per_node < 1) throw InputError("--gpus-per-node: must be >= 1");
  if (o.deepen_home.empty())
    throw InputError("cannot find the deepen checkout holding slurm/study_array.sbatch (run from the checkout)");
  const std::string abs_dir = fs::absolute(dir).lexically_normal().string();
  const std::string base = fs::absolute(plan.spec.base).lexically_normal().string();
  SlurmScripts s;

  // One array element per unit: a run alone, or a teacher group of several runs.
  const std::vector<StudyGroup> units = study_units(plan);
  std::vector<size_t> unit_of(plan.jobs.size(), 0);
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t k : units[u].members) unit_of[k] = u;
  auto unit_name = [&](size_t u) {
    std::string name;
    for (size_t k : units[u].members) name += (name.empty() ? "" : "+") + plan.jobs[k].id();
    return name;
  };
  std::vector<int64_t> tasks(units.size());
  std::vector<std::vector<size_t>> unit_deps(units.size());
  std::ostringstream list;
  list << "# Study " << plan.spec.name << " (" << plan.spec.source << "): one job per line; the array index is the\n"
       << "# line number counting from 0 (comment lines do not count). Written by `deepen study --slurm`.\n";
  for (size_t u = 0; u < units.size(); ++u) {
    for (size_t k : units[u].members)
      for (size_t d : plan.jobs[k].depends_on)
        if (unit_of[d] != u && std::find(unit_deps[u].begin(), unit_deps[u].end(), unit_of[d]) == unit_deps[u].end())
          unit_deps[u].push_back(unit_of[d]);
    if (units[u].members.size() == 1) {
      const StudyJob& j = plan.jobs[units[u].members.front()];
      std::string line = without_spaces(base, "study.base");
      for (const auto& ov : j.overrides) line += " --set " + without_spaces(ov, j.id());
      list << line << " --quiet\n";
      tasks[u] = job_tasks(plan, j);
      continue;
    }
    GroupSpec g = group_spec(plan, u, units[u].members);
    for (GroupRunSpec& r : g.runs) r.config = base;
    const std::string name = "groups/g" + std::to_string(u) + ".toml";
    g.source = without_spaces(abs_dir + "/" + name, "--slurm");
    s.group_files.emplace_back(name, group_file_text(g));
    list << "group " << g.source << " --quiet\n";
    tasks[u] = group_world_size(plan, units[u]);
  }
  // study.teacher = "cache": the cache job's parts follow the runs' lines (indices units.size() + i),
  // each a one-GPU task writing every cache_parts-th file; the part that completes the set writes
  // the manifest, and every run waits for the whole cache array.
  const int64_t cache_parts = plan.cache ? plan.spec.cache_parts : 0;
  for (int64_t i = 0; i < cache_parts; ++i) {
    std::string line = "cache " + without_spaces(base, "study.base");
    for (const auto& ov : plan.cache->overrides) line += " --set " + without_spaces(ov, "the teacher cache");
    line += " --out " + without_spaces(fs::absolute(plan.cache->dir).lexically_normal().string(), "study.cache_dir");
    list << line << " --part " << i << "/" << cache_parts << " --quiet\n";
  }
  s.study_list = list.str();

  auto resources = [&](int64_t n) {
    const int64_t nodes = (n + o.gpus_per_node - 1) / o.gpus_per_node;
    const int64_t per_node = std::min(n, o.gpus_per_node);
    return "--nodes=" + std::to_string(nodes) + " --ntasks=" + std::to_string(n) + " --ntasks-per-node=" +
           std::to_string(per_node) + " --gpus-per-node=" + std::to_string(per_node);
  };
  // A unit is finished when every run in it is.
  auto finished_test = [&](size_t u) {
    std::string t;
    for (size_t k : units[u].members) t += std::string(t.empty() ? "" : " && ") + "finished " + shell_quote(plan.jobs[k].out_dir);
    return t;
  };
  std::ostringstream sub;
  sub << "#!/usr/bin/env bash\n"
      << "# Submits study " << plan.spec.name << " (" << plan.jobs.size() << " runs";
  if (!plan.groups.empty()) sub << " in " << units.size() << " jobs, runs sharing a teacher in one";
  sub << ") to Slurm through slurm/study_array.sbatch.\n"
      << "# Runs that finished already are skipped, so submitting again after a failure is safe.\n"
      << "set -euo pipefail\n"
      << "list=" << shell_quote(abs_dir + "/study.list") << "\n"
      << "export DEEPEN_HOME=${DEEPEN_HOME:-" << shell_quote(o.deepen_home) << "}\n"
      << "export DEEPEN_BIN=${DEEPEN_BIN:-" << shell_quote(o.deepen_exe) << "}\n"
      << "export DEEPEN_CMD=" << option_name(plan.spec.command) << "\n"
      << "cd " << shell_quote(o.workdir) << "  # relative paths in the configs resolve here\n"
      << "common=(--job-name=" << shell_quote(plan.spec.name) << " --output=" << shell_quote(abs_dir + "/logs/%x-%A_%a.out")
      << " --time=" << o.time << " --cpus-per-task=" << o.cpus_per_task;
  if (!o.partition.empty()) sub << " --partition=" << shell_quote(o.partition);
  if (!o.account.empty()) sub << " --account=" << shell_quote(o.account);
  sub << ")\n"
      << "finished() { grep -qs '\"complete\": *true' \"" << RunFolder("$1").active_layer_tokens_json() << "\"; }\n"
      << "submit() { local id; id=$(sbatch --parsable \"${common[@]}\" \"$@\" \"$DEEPEN_HOME/slurm/study_array.sbatch\" \"$list\"); echo \"${id%%;*}\"; }\n"
      << "declare -A job  # array index -> \"<job id>_<index>\" once submitted\n"
      << "after() {  # the afterok list of the given indices that were submitted (finished ones need no wait)\n"
      << "  local d=${cache:-} i; for i in \"$@\"; do [[ -n ${job[$i]:-} ]] && d+=\"${d:+:}${job[$i]}\"; done; echo \"$d\"; }\n";
  if (cache_parts > 0) {
    const std::string manifest = (fs::absolute(plan.cache->dir) / "manifest.json").lexically_normal().string();
    sub << "\n# The teacher cache (study.teacher = \"cache\"): " << cache_parts << " one-GPU task(s), before every run\n"
        << "cache=\"\"\n"
        << "if [[ -f " << shell_quote(manifest) << " ]]; then echo \"teacher cache: complete, skipped\"; else\n"
        << "  cache=$(submit --array=" << units.size() << "-" << units.size() + static_cast<size_t>(cache_parts) - 1 << " "
        << resources(1) << ")\n"
        << "  echo \"teacher cache: array $cache\"\nfi\n";
  }
  std::map<int64_t, std::vector<size_t>> independent;
  for (size_t u = 0; u < units.size(); ++u)
    if (unit_deps[u].empty()) independent[tasks[u]].push_back(u);
  for (const auto& [n, members] : independent) {
    sub << "\n# " << members.size() << " independent job(s) of " << n << " task(s)\nidx=()\n";
    for (size_t u : members)
      sub << "if " << finished_test(u) << "; then echo \"" << unit_name(u) << ": finished, skipped\"; else idx+=(" << u
          << "); fi\n";
    sub << "if ((${#idx[@]})); then\n"
        << "  id=$(submit --array=\"$(IFS=,; echo \"${idx[*]}\")\" ${cache:+--dependency=afterok:$cache} " << resources(n)
        << ")\n"
        << "  for i in \"${idx[@]}\"; do job[$i]=${id}_$i; done\n"
        << "  echo \"array $id: indices ${idx[*]}\"\nfi\n";
  }
  for (size_t u = 0; u < units.size(); ++u) {
    if (unit_deps[u].empty()) continue;
    sub << "\n# " << unit_name(u) << " waits for";
    for (size_t d : unit_deps[u]) sub << " " << unit_name(d);
    sub << "\nif " << finished_test(u) << "; then echo \"" << unit_name(u) << ": finished, skipped\"; else\n"
        << "  dep=$(after";
    for (size_t d : unit_deps[u]) sub << " " << d;
    sub << ")\n"
        << "  id=$(submit --array=" << u << " ${dep:+--dependency=afterok:$dep} " << resources(tasks[u]) << ")\n"
        << "  job[" << u << "]=${id}_" << u << "\n"
        << "  echo \"" << unit_name(u) << ": job ${id}_" << u << "${dep:+ after $dep}\"\nfi\n";
  }
  s.submit_sh = sub.str();
  return s;
}

void write_slurm_study(const StudyPlan& plan, const SlurmOptions& options, const std::string& dir) {
  const SlurmScripts s = slurm_scripts(plan, options, dir);
  fs::create_directories(fs::path(dir) / "logs");
  auto write = [&](const std::string& name, const std::string& text, bool exec) {
    const fs::path p = fs::path(dir) / name;
    std::ofstream out(p, std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error(p.string() + ": write failed");
    out.close();
    if (exec) fs::permissions(p, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::add);
  };
  if (!s.group_files.empty()) fs::create_directories(fs::path(dir) / "groups");
  for (const auto& [name, text] : s.group_files) write(name, text, false);
  write("study.list", s.study_list, false);
  write("submit.sh", s.submit_sh, true);
}

}  // namespace deepen