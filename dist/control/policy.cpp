// Control-plane decisions: handshake MACs, the watchdog verdict and the agreed stop step.
#include "dist/control/policy.h"

#include <algorithm>
#include <map>
#include <cstdio>
#include <string_view>

#include "config/input_error.h"
#include "dist/control/hmac.h"

namespace deepen::control {
namespace {

std::span<const uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

AbortInfo blame(const RankView& r, const std::string& what) {
  return AbortInfo{r.rank, r.host, r.step, describe_rank(r) + ": " + what};
}

}  // namespace

Mac agent_mac(const Secret& secret, const Nonce& server_nonce, const Auth& auth) {
  Auth unsigned_auth = auth;
  unsigned_auth.mac = {};
  const std::vector<uint8_t> body = encode(unsigned_auth);
  return hmac_sha256(secret, {bytes("deepen-control-v1 agent"), server_nonce, body});
}

Mac coordinator_mac(const Secret& secret, const Nonce& server_nonce, const Nonce& agent_nonce,
                    int32_t rank) {
  const uint8_t r[4] = {uint8_t(uint32_t(rank) >> 24), uint8_t(uint32_t(rank) >> 16),
                        uint8_t(uint32_t(rank) >> 8), uint8_t(rank)};
  return hmac_sha256(secret, {bytes("deepen-control-v1 coordinator"), server_nonce, agent_nonce,
                              std::span<const uint8_t>(r, 4)});
}

Nonce random_nonce() { return generate_secret(); }

FrameKeys frame_keys(const Secret& secret, const Nonce& server_nonce, const Nonce& agent_nonce, int32_t rank) {
  const uint8_t r[4] = {uint8_t(uint32_t(rank) >> 24), uint8_t(uint32_t(rank) >> 16),
                        uint8_t(uint32_t(rank) >> 8), uint8_t(rank)};
  const std::span<const uint8_t> rank_bytes(r, 4);
  return FrameKeys{
      hmac_sha256(secret, {bytes("deepen-control-v5 frames agent->coordinator"), server_nonce, agent_nonce, rank_bytes}),
      hmac_sha256(secret, {bytes("deepen-control-v5 frames coordinator->agent"), server_nonce, agent_nonce, rank_bytes})};
}

std::string describe_rank(const RankView& r) {
  std::string s = "rank " + std::to_string(r.rank) + " on " + (r.host.empty() ? "?" : r.host);
  std::string detail = r.run.empty() ? r.role : "run " + r.run + ", " + r.role;
  if (r.pid > 0) detail += (detail.empty() ? "" : ", ") + std::string("pid ") + std::to_string(r.pid);
  if (!detail.empty()) s += " (" + detail + ")";
  s += r.step >= 0 ? ", last step " + std::to_string(r.step) : ", before its first step";
  return s;
}

std::optional<AbortInfo> watchdog_verdict(std::span<const RankView> ranks, double since_start_s,
                                          const WatchdogLimits& limits) {
  const std::string limit = " (limit control.watchdog_s = " + seconds(limits.watchdog_s) + ")";
  for (const RankView& r : ranks) {
    if (r.state == RankState::kLost) {
      return blame(r, r.dropped_why.empty() ? "control connection lost; the process died or its node failed"
                                            : "control connection dropped by the coordinator: " + r.dropped_why);
    }
  }
  for (const RankView& r : ranks) {
    const bool run_outcome = r.run_stopped && (r.exit_code == 4 || r.exit_code == 5);
    if (r.state == RankState::kDone && r.exit_code != 0 && r.exit_code != 3 && !run_outcome) {
      AbortInfo info = blame(r, "exited with code " + std::to_string(r.exit_code) +
                                    (r.bye_message.empty() ? "" : ": " + r.bye_message));
      info.exit_code = r.exit_code;
      return info;
    }
  }
  const RankView* oldest = nullptr;
  for (const RankView& r : ranks) {
    if (r.state == RankState::kConnected && r.heartbeat_age_s > limits.watchdog_s &&
        (!oldest || r.heartbeat_age_s > oldest->heartbeat_age_s)) {
      oldest = &r;
    }
  }
  if (oldest) {
    // The other ranks of its host silent for over half the limit too (they went silent at the same
    // moment, a beat apart): a lost node takes all of them, and their roles say what it held.
    std::string also;
    for (const RankView& r : ranks) {
      if (&r == oldest || r.host != oldest->host || r.state != RankState::kConnected ||
          r.heartbeat_age_s <= limits.watchdog_s / 2)
        continue;
      also += (also.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r.rank) +
              (r.role.empty() ? "" : " (" + r.role + ")");
    }
    if (!also.empty()) also = "; silent on " + oldest->host + " too: " + also;
    AbortInfo info = blame(*oldest, "no heartbeat for " + seconds(oldest->heartbeat_age_s) + limit +
                                        "; its node is lost or unreachable (a cut link), or the process is frozen" +
                                        also);
    info.exit_code = kExitUnreachable;
    return info;
  }
  const RankView* first_stalled = nullptr;
  double least_stall = 0;
  bool any_connected = false;
  for (const RankView& r : ranks) {
    if (r.state != RankState::kConnected) continue;
    least_stall = any_connected ? std::min(least_stall, r.stall_s) : r.stall_s;
    any_connected = true;
    if (!first_stalled || r.stall_s > first_stalled->stall_s) first_stalled = &r;
  }
  if (any_connected && least_stall > limits.watchdog_s) {
    std::string doing;
    if (first_stalled->activity == kActivityWaiting)
      doing = ", waiting in " + first_stalled->waiting_in;
    else if (first_stalled->activity == kActivityBlocked)
      doing = ", blocked outside any communicator call and using no CPU (I/O? a lock?)";
    return blame(*first_stalled,
                 "no rank has made progress for " + seconds(least_stall) +
                     "; this one stopped first, " + seconds(first_stalled->stall_s) + " ago in phase \"" +
                     first_stalled->phase + "\"" + doing + limit + "; a collective or I/O hangs");
  }
  if (since_start_s > limits.connect_timeout_s) {
    std::string missing;
    const RankView* first = nullptr;
    for (const RankView& r : ranks) {
      if (r.state != RankState::kNeverConnected) continue;
      if (!first) first = &r;
      missing += (missing.empty() ? "" : ", ") + std::to_string(r.rank);
    }
    if (first) {
      return AbortInfo{first->rank, "", -1,
                       "rank " + std::to_string(first->rank) +
                           " never connected to the coordinator within " +
                           seconds(limits.connect_timeout_s) + " (missing ranks: " + missing +
                           "); it failed to start, or DEEPEN_COORDINATOR / the job secret differ"};
    }
  }
  return std::nullopt;
}

int64_t decide_stop_step(std::span<const int64_t> reaches) {
  int64_t s = kStopAtFirstStep;
  for (int64_t r : reaches) s = std::max(s, r);
  return s;
}

std::optional<int64_t> run_step(const RunSteps& steps, const std::string& run) {
  for (const auto& [name, step] : steps)
    if (name == run) return step;
  return std::nullopt;
}

RunSteps decide_run_stops(std::span<const RunSteps> acks, const std::string& scope, const RunSteps& decided) {
  std::map<std::string, int64_t> reach;  // by run name: sorted, so every coordinator decides alike
  for (const RunSteps& ack : acks)
    for (const auto& [run, r] : ack) {
      if (scope != kEveryRun && run != scope) continue;
      if (run_step(decided, run)) continue;
      auto [it, added] = reach.emplace(run, kStopAtFirstStep);
      it->second = std::max(it->second, r);
    }
  return RunSteps(reach.begin(), reach.end());
}

bool is_teacher_role(const std::string& role) { return role.rfind("teacher", 0) == 0; }

std::optional<int> job_exit_code(std::span<const RankView> ranks) {
  if (ranks.empty()) return std::nullopt;
  for (const RankView& r : ranks)
    if (r.state != RankState::kDone) return std::nullopt;
  for (const RankView& r : ranks)
    if (r.exit_code != 0 && r.exit_code != 3 && r.exit_code != 4 && r.exit_code != 5) return r.exit_code;
  bool stopped = false, rolled_back = false, diverged = false;
  for (const RankView& r : ranks) {
    if (is_teacher_role(r.role)) continue;
    stopped |= r.exit_code == 3;
    rolled_back |= r.exit_code == 5;
    diverged |= r.exit_code == 4;
  }
  if (stopped) return 3;
  if (rolled_back) return 5;
  if (diverged) return 4;
  return 0;
}

}  // namespace deepen::control
