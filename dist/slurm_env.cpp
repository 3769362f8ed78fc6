// Slurm environment parsing and host-list expansion (pure; slurm_environment() reads the process env).
#include "dist/slurm_env.h"

#include <charconv>

#include "config/input_error.h"

extern char** environ;

namespace deepen {
namespace {

constexpr size_t kMaxHosts = 1'000'000;  // a typo like [1-999999999] must not eat the memory

[[noreturn]] void bad(const std::string& variable, const std::string& value, const std::string& why) {
  throw InputError(variable + "=\"" + value + "\": " + why);
}

// Top-level commas separate hosts; commas inside brackets separate ranges.
std::vector<std::string> split_top_level(const std::string& list, const std::string& variable) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) bad(variable, list, "']' without '['");
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) bad(variable, list, "'[' without ']'");
  items.push_back(cur);
  return items;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// "01-03,07" -> 01 02 03 07 (padded to the lower bound's width).
std::vector<std::string> expand_ranges(const std::string& ranges, const std::string& variable,
                                       const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    if (comma == std::string::npos) comma = ranges.size();
    const std::string part = ranges.substr(start, comma - start);
    const size_t dash = part.find('-');
    const std::string lo = part.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 9 || hi.size() > 9)
      bad(variable, list, "bad range \"" + part + "\" (expected N or N-M with digits)");
    const long a = std::stol(lo), b = std::stol(hi);
    if (b < a) bad(variable, list, "reversed range \"" + part + "\"");
    if (out.size() + static_cast<size_t>(b - a + 1) > kMaxHosts) bad(variable, list, "too many hosts");
    for (long v = a; v <= b; ++v) {
      std::string s = std::to_string(v);
      if (s.size() < lo.size()) s.insert(0, lo.size() - s.size(), '0');
      out.push_back(s);
    }
    start = comma + 1;
  }
  return out;
}

// One host pattern, e.g. "r[1-2]-n[01-02]" -> r1-n01 r1-n02 r2-n01 r2-n02.
void expand_host(const std::string& pattern, const std::string& variable, const std::string& list,
                 std::vector<std::string>& out) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < pattern.size()) {
    const size_t open = pattern.find('[', i);
    const std::string literal = pattern.substr(i, open == std::string::npos ? std::string::npos : open - i);
    for (auto& p : partial) p += literal;
    if (open == std::string::npos) break;
    const size_t close = pattern.find(']', open);
    if (close == std::string::npos) bad(variable, list, "'[' without ']'");
    const std::vector<std::string> values = expand_ranges(pattern.substr(open + 1, close - open - 1),
                                                          variable, list);
    if (partial.size() * values.size() > kMaxHosts) bad(variable, list, "too many hosts");
    std::vector<std::string> next;
    for (const auto& p : partial)
      for (const auto& v : values) next.push_back(p + v);
    partial = std::move(next);
    i = close + 1;
  }
  out.insert(out.end(), partial.begin(), partial.end());
}

const std::string* find(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

int require_int(const std::map<std::string, std::string>& env, const char* name, const char* fallback,
                int min_value) {
  const std::string* v = find(env, name);
  std::string used = name;
  if (!v && fallback) {
    v = find(env, fallback);
    used = fallback;
  }
  if (!v) throw InputError(std::string(name) + ": not set, though SLURM_PROCID is (not an srun task?)");
  int out = 0;
  const char* end = v->data() + v->size();
  auto [p, ec] = std::from_chars(v->data(), end, out);
  if (ec != std::errc() || p != end) bad(used, *v, "expected an integer");
  if (out < min_value) bad(used, *v, "must be at least " + std::to_string(min_value));
  return out;
}

}  // namespace

std::vector<std::string> expand_nodelist(const std::string& list, const std::string& variable) {
  std::vector<std::string> hosts;
  for (const std::string& item : split_top_level(list, variable)) {
    if (item.empty()) bad(variable, list, "empty host name");
    expand_host(item, variable, list, hosts);
  }
  return hosts;
}

std::optional<SlurmEnv> parse_slurm_env(const std::map<std::string, std::string>& env) {
  if (!find(env, "SLURM_PROCID")) return std::nullopt;
  SlurmEnv s;
  s.rank = require_int(env, "SLURM_PROCID", nullptr, 0);
  s.world_size = require_int(env, "SLURM_NTASKS", "SLURM_NPROCS", 1);
  s.local_rank = require_int(env, "SLURM_LOCALID", nullptr, 0);
  s.node_id = require_int(env, "SLURM_NODEID", nullptr, 0);
  const char* list_var = find(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
  const std::string* list = find(env, list_var);
  if (!list) throw InputError("SLURM_JOB_NODELIST: not set, though SLURM_PROCID is");
  s.nodes = expand_nodelist(*list, list_var);
  if (s.rank >= s.world_size)
    throw InputError("SLURM_PROCID=" + std::to_string(s.rank) + " is not below SLURM_NTASKS=" +
                     std::to_string(s.world_size));
  if (s.node_id >= static_cast<int>(s.nodes.size()))
    throw InputError("SLURM_NODEID=" + std::to_string(s.node_id) + " is outside " + list_var + "=\"" +
                     *list + "\" (" + std::to_string(s.nodes.size()) + " nodes)");
  s.coordinator_host = s.nodes.front();
  if (const std::string* id = find(env, "SLURM_JOB_ID")) s.job_id = *id;
  return s;
}

std::map<std::string, std::string> slurm_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("SLURM_", 0) != 0) continue;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

}  // namespace deepen
