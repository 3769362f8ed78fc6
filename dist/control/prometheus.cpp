// /metrics body: the coordinator's view of every rank in Prometheus text exposition format 0.0.4.
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <string_view>

#include "dist/control/coordinator.h"

namespace deepen::control {
namespace {

// HELP text of the trainer metrics the design names; others get a generic line.
const std::map<std::string, std::string, std::less<>>& known_help() {
  static const std::map<std::string, std::string, std::less<>> kHelp = {
      {"train_loss", "Training loss of the last step (alpha * tau^2 * KL + (1 - alpha) * CE)."},
      {"train_kl", "KL(teacher || student) of the last training step."},
      {"train_ce", "Cross-entropy on the labels of the last training step."},
      {"eval_ce", "Validation cross-entropy on held-out tokens at the last eval."},
      {"eval_kl", "Validation KL(teacher || student) at the last eval."},
      {"tokens_per_s", "Training tokens per second through this rank."},
      {"logit_bytes_per_s", "Logit-channel bytes per second sent (teacher) or received (student)."},
      {"channel_bytes_per_s", "Logit-channel bytes per second sent (teacher) or received (student)."},
      {"lr", "Learning rate of the last step."},
      {"grad_norm", "Global gradient L2 norm of the last step, before clipping."},
  };
  return kHelp;
}

const std::set<std::string, std::less<>>& builtin_families() {
  static const std::set<std::string, std::less<>> kBuiltin = {
      "deepen_world_size", "deepen_ranks_connected", "deepen_aborted", "deepen_stop_step",
      "deepen_rank_up", "deepen_step", "deepen_stage", "deepen_active_depth",
      "deepen_heartbeat_age_seconds"};
  return kBuiltin;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : "NaN";
}

std::string escape_label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// HELP text escapes only backslash and line feed (quotes stay as they are).
std::string escape_help(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string labels(const RankView& r) {
  return "{rank=\"" + std::to_string(r.rank) + "\",host=\"" + escape_label(r.host) + "\",role=\"" +
         escape_label(r.role) + "\"}";
}

// "eval/ce-loss" -> "deepen_eval_ce_loss"; a clash with a built-in family -> "deepen_metric_step".
std::string family_name(std::string_view key) {
  std::string name = "deepen_";
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    name += ok ? c : '_';
  }
  if (builtin_families().count(name)) name = "deepen_metric_" + name.substr(7);
  return name;
}

struct Family {
  std::string help;
  std::vector<std::string> samples;  // "labels value"
};

void emit(std::string& out, const std::string& name, const std::string& help,
          const std::vector<std::string>& samples) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n";
  for (const auto& s : samples) out += name + s + "\n";
}

}  // namespace

std::string render_prometheus(const std::vector<RankView>& ranks, std::optional<int64_t> stop_step,
                              bool aborted) {
  std::string out;
  int connected = 0;
  std::vector<const RankView*> seen;  // ranks that ever connected: only they have a host and state
  for (const RankView& r : ranks) {
    if (r.state == RankState::kConnected) ++connected;
    if (r.state != RankState::kNeverConnected) seen.push_back(&r);
  }
  emit(out, "deepen_world_size", "Ranks in the job.", {" " + std::to_string(ranks.size())});
  emit(out, "deepen_ranks_connected", "Ranks whose control connection is up.",
       {" " + std::to_string(connected)});
  emit(out, "deepen_aborted", "1 once the watchdog has aborted the job.", {aborted ? " 1" : " 0"});
  emit(out, "deepen_stop_step", "Agreed step of the coordinated stop; -1 while none.",
       {" " + std::to_string(stop_step.value_or(-1))});

  auto per_rank = [&](const std::string& name, const std::string& help, auto value_of) {
    std::vector<std::string> samples;
    for (const RankView* r : seen) samples.push_back(labels(*r) + " " + value_of(*r));
    emit(out, name, help, samples);
  };
  if (seen.empty()) return out;
  per_rank("deepen_rank_up", "1 while the rank's control connection is up.",
           [](const RankView& r) { return std::string(r.state == RankState::kConnected ? "1" : "0"); });
  per_rank("deepen_step", "Optimizer steps completed by the rank; -1 before the first.",
           [](const RankView& r) { return std::to_string(r.step); });
  per_rank("deepen_stage", "Curriculum stage of the rank.",
           [](const RankView& r) { return std::to_string(r.stage); });
  per_rank("deepen_active_depth", "Active student depth (blocks in use) on the rank.",
           [](const RankView& r) { return std::to_string(r.depth); });
  per_rank("deepen_heartbeat_age_seconds", "Seconds since the coordinator last heard from the rank.",
           [](const RankView& r) { return format_value(r.heartbeat_age_s); });

  std::map<std::string, Family> families;
  for (const RankView* r : seen) {
    std::set<std::string> names_this_rank;  // a repeated series would make the exposition invalid
    for (const auto& [key, value] : r->metrics) {
      if (key.empty()) continue;
      const std::string name = family_name(key);
      if (!names_this_rank.insert(name).second) continue;
      Family& f = families[name];
      if (f.help.empty()) {
        const auto it = known_help().find(key);
        f.help = it != known_help().end()
                     ? it->second
                     : "Trainer metric \"" + escape_help(key) + "\" as reported by each rank.";
      }
      f.samples.push_back(labels(*r) + " " + format_value(value));
    }
  }
  for (const auto& [name, f] : families) emit(out, name, f.help, f.samples);
  return out;
}

}  // namespace deepen::control
