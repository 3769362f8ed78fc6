// Group files: parse, write, load the member configs (see group_file.h).
#include "study/group_file.h"

#include <sstream>

#include <toml++/toml.h>

#include "config/input_error.h"
#include "config/text_file.h"
#include "config/toml_text.h"
#include "study/table_reader.h"

namespace deepen {

GroupSpec parse_group_file(const std::string& toml_text, const std::string& source) {
  const toml::table root = parse_toml(toml_text, source);
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "group" && key != "run")
      throw InputError(source + ": [" + key + "]: unknown section (a group file has [group] and [[run]])");
  }
  GroupSpec g;
  g.source = source;
  const toml::table* group = root["group"].as_table();
  if (!group) throw InputError(source + ": [group]: missing (name, out_dir)");
  TableReader r(*group, source, "group");
  r.string("name", g.name);
  r.string("out_dir", g.out_dir);
  r.reject_unknown();
  if (g.out_dir.empty()) r.fail("out_dir", "required: the group's own folder (teacher records, control secret)");
  const toml::array* runs = root["run"].as_array();
  if (!runs || runs->empty()) throw InputError(source + ": [[run]]: a group needs at least one run");
  for (size_t i = 0; i < runs->size(); ++i) {
    const toml::table* t = (*runs)[i].as_table();
    if (!t) throw InputError(source + ": run[" + std::to_string(i) + "]: expected a [[run]] table");
    TableReader rr(*t, source, "run[" + std::to_string(i) + "]");
    GroupRunSpec run;
    rr.string("config", run.config);
    rr.strings("set", run.sets);
    rr.reject_unknown();
    if (run.config.empty()) rr.fail("config", "required: the run's config file");
    g.runs.push_back(std::move(run));
  }
  return g;
}

GroupSpec load_group_file(const std::string& path) { return parse_group_file(read_file_text(path, "group file"), path); }

std::string group_file_text(const GroupSpec& g) {
  std::ostringstream o;
  o << "# The runs of one shared-teacher job: `deepen group " << g.source << "` (written by deepen study).\n"
    << "[group]\nname = " << toml_quote(g.name) << "\nout_dir = " << toml_quote(g.out_dir) << "\n";
  for (const GroupRunSpec& run : g.runs) {
    o << "\n[[run]]\nconfig = " << toml_quote(run.config) << "\nset = [";
    for (size_t i = 0; i < run.sets.size(); ++i) o << (i ? ", " : "") << toml_quote(run.sets[i]);
    o << "]\n";
  }
  return o.str();
}

std::vector<Config> load_group_configs(const GroupSpec& group, const std::vector<std::string>& extra_sets) {
  std::vector<Config> out;
  for (const GroupRunSpec& run : group.runs) {
    std::vector<std::string> sets = run.sets;
    sets.insert(sets.end(), extra_sets.begin(), extra_sets.end());
    out.push_back(load_config(run.config, sets));
  }
  return out;
}

}  // namespace deepen
