// /metrics body: the coordinator's view of every rank, as Prometheus text (prometheus-cpp writes it).
//
// prometheus-cpp, not a hand-written writer: the library escapes label values, writes the HELP/TYPE
// lines and formats values (NaN as "Nan", which Prometheus' own parsers read), so that part of the
// format is not deepen's to get wrong. Its data model (MetricFamily, ClientMetric), not its
// Registry/Gauge API, because /metrics is a snapshot rendered on request from what the coordinator
// already holds, not instruments updated in place. A sample's labels are a plain list there, so the
// per-rank labels (rank, host, role) are three entries, and a label that several runs sharing one job
// will need (run) is one more. What stays here: which families exist, the trainer metrics' names
// made valid, and HELP escaping (the library writes HELP text as given).
#include <map>
#include <set>
#include <string_view>

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include "dist/control/coordinator.h"

namespace deepen::control {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;

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
      "deepen_heartbeat_age_seconds", "deepen_control_connections_total", "deepen_control_http_requests_total"};
  return kBuiltin;
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

MetricFamily gauge_family(std::string name, std::string_view help) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = escape_help(help);
  f.type = prometheus::MetricType::Gauge;
  return f;
}

ClientMetric sample(std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

std::vector<ClientMetric::Label> rank_labels(const RankView& r) {
  // run: which run a student trains when runs share one teacher (one job, several run folders);
  // empty for teachers and single-run jobs, which Prometheus reads as no label.
  return {{"rank", std::to_string(r.rank)}, {"host", r.host}, {"role", r.role}, {"run", r.run}};
}

}  // namespace

std::string render_coordinator_counters(const CoordinatorStats& s) {
  std::vector<MetricFamily> out(2);
  out[0].name = "deepen_control_connections_total";
  out[0].help = "Control-plane connections by outcome: accepted (TCP), authenticated, rejected_auth (wrong "
                "secret, world or rank), protocol_errors (bad frame, wrong frame MAC), timed_out (no handshake in "
                "time), refused_busy (over control max_pending unauthenticated connections).";
  out[0].type = prometheus::MetricType::Counter;
  const std::pair<const char*, uint64_t> outcomes[] = {
      {"accepted", s.accepted},         {"authenticated", s.authenticated}, {"rejected_auth", s.rejected_auth},
      {"protocol_errors", s.protocol_errors}, {"timed_out", s.timed_out},     {"refused_busy", s.refused_busy}};
  for (const auto& [outcome, value] : outcomes) {
    ClientMetric m;
    m.label = {{"outcome", outcome}};
    m.counter.value = double(value);
    out[0].metric.push_back(m);
  }
  out[1].name = "deepen_control_http_requests_total";
  out[1].help = "Requests to /metrics answered, whatever their status.";
  out[1].type = prometheus::MetricType::Counter;
  ClientMetric m;
  m.counter.value = double(s.http_requests);
  out[1].metric.push_back(m);
  return prometheus::TextSerializer().Serialize(out);
}

std::string render_prometheus(const std::vector<RankView>& ranks, std::optional<int64_t> stop_step,
                              bool aborted) {
  std::vector<MetricFamily> out;
  auto job_gauge = [&](const char* name, std::string_view help, double value) {
    out.push_back(gauge_family(name, help));
    out.back().metric.push_back(sample({}, value));
  };
  int connected = 0;
  std::vector<const RankView*> seen;  // ranks that ever connected: only they have a host and state
  for (const RankView& r : ranks) {
    if (r.state == RankState::kConnected) ++connected;
    if (r.state != RankState::kNeverConnected) seen.push_back(&r);
  }
  job_gauge("deepen_world_size", "Ranks in the job.", double(ranks.size()));
  job_gauge("deepen_ranks_connected", "Ranks whose control connection is up.", connected);
  job_gauge("deepen_aborted", "1 once the watchdog has aborted the job.", aborted ? 1 : 0);
  job_gauge("deepen_stop_step", "Agreed step of the coordinated stop; -1 while none.",
            double(stop_step.value_or(-1)));

  auto per_rank = [&](const char* name, std::string_view help, auto value_of) {
    out.push_back(gauge_family(name, help));
    for (const RankView* r : seen) out.back().metric.push_back(sample(rank_labels(*r), value_of(*r)));
  };
  if (!seen.empty()) {
    per_rank("deepen_rank_up", "1 while the rank's control connection is up.",
             [](const RankView& r) { return r.state == RankState::kConnected ? 1.0 : 0.0; });
    per_rank("deepen_step", "Optimizer steps completed by the rank; -1 before the first.",
             [](const RankView& r) { return double(r.step); });
    per_rank("deepen_stage", "Curriculum stage of the rank.", [](const RankView& r) { return double(r.stage); });
    per_rank("deepen_active_depth", "Active student depth (blocks in use) on the rank.",
             [](const RankView& r) { return double(r.depth); });
    per_rank("deepen_heartbeat_age_seconds", "Seconds since the coordinator last heard from the rank.",
             [](const RankView& r) { return r.heartbeat_age_s; });
  }

  std::map<std::string, MetricFamily> trainer;  // by name, so the text's order does not follow the ranks'
  for (const RankView* r : seen) {
    std::set<std::string> names_this_rank;  // a repeated series would make the exposition invalid
    for (const auto& [key, value] : r->metrics) {
      if (key.empty()) continue;
      const std::string name = family_name(key);
      if (!names_this_rank.insert(name).second) continue;
      auto it = trainer.find(name);
      if (it == trainer.end()) {
        const auto help = known_help().find(key);
        it = trainer.emplace(name, gauge_family(name, help != known_help().end()
                                                          ? help->second
                                                          : "Trainer metric \"" + key + "\" as reported by each rank."))
                 .first;
      }
      it->second.metric.push_back(sample(rank_labels(*r), value));
    }
  }
  for (auto& [name, f] : trainer) out.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(out);
}

}  // namespace deepen::control
