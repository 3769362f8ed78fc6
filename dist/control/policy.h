// Control-plane decisions as pure functions: handshake MACs, watchdog verdict, agreed stop step.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "dist/control/secret.h"
#include "dist/control/wire.h"

namespace deepen::control {

// Why a job aborts, as every rank prints it: "rank 3 on node02 (student 3, pid 1234), last step 17:
// control connection lost; the process died or its node failed".
struct AbortInfo {
  int rank = -1;        // the rank at fault; -1 when no single rank is (e.g. a lost coordinator)
  std::string host;
  int64_t step = -1;    // its last reported step; -1 = it had not completed one
  std::string message;  // the full sentence above
  // The code every rank of the job exits with: a rank that left with a reported error (its Bye's
  // code: 2 bad input, 4 diverged, ...) lends it to all, so the launcher's exit code says what
  // happened whichever rank it reports; 1 (kExitFailure) for a death, a hang or a lost peer.
  int exit_code = 1;
};

// ---- Handshake --------------------------------------------------------------------------------
// The coordinator sends a fresh nonce; the agent answers with its identity, its own nonce and
//   agent_mac = HMAC(secret, "deepen-control-v1 agent" | server nonce | Auth encoded with mac = 0)
// so the MAC covers every field it sends; the coordinator answers with
//   coordinator_mac = HMAC(secret, "deepen-control-v1 coordinator" | server nonce | agent nonce | rank)
// so the agent knows it talks to its own job's coordinator (ABORT and STOP from anyone else would be
// a denial of service). Nonces on both sides make a recorded exchange useless for a replay.
Mac agent_mac(const Secret& secret, const Nonce& server_nonce, const Auth& auth);
Mac coordinator_mac(const Secret& secret, const Nonce& server_nonce, const Nonce& agent_nonce,
                    int32_t rank);
Nonce random_nonce();  // 32 bytes from OpenSSL's RAND_bytes, as generate_secret()

// Every frame after the handshake carries a MAC (framed_connection.h), under a key per direction
// that only this connection's two ends can make:
//   key = HMAC(secret, "deepen-control-v5 frames agent->coordinator" (or "coordinator->agent")
//              | server nonce | agent nonce | rank)
// Fresh nonces make the keys fresh per connection: a frame recorded on another connection, or sent
// back the other way, fails the check.
struct FrameKeys {
  Mac agent_to_coordinator{};
  Mac coordinator_to_agent{};
};
FrameKeys frame_keys(const Secret& secret, const Nonce& server_nonce, const Nonce& agent_nonce, int32_t rank);

// ---- Watchdog ---------------------------------------------------------------------------------
enum class RankState { kNeverConnected, kConnected, kLost, kDone };

// What the coordinator knows about one rank when the watchdog looks.
struct RankView {
  int rank = 0;
  std::string host;
  std::string role;
  std::string run;             // a student's run in a job of several ("" otherwise)
  int64_t pid = 0;
  RankState state = RankState::kNeverConnected;
  int64_t step = -1;
  int64_t stage = 0;
  int64_t depth = 0;           // active student depth
  std::string phase;
  MetricList metrics;          // the trainer's last metric map (losses, tokens/s, bytes/s, ...)
  double heartbeat_age_s = 0;  // since the last frame from it
  // Since its (step, phase) last changed or it last reported computing (dist/control/activity.h):
  // a rank whose trainer computes is making progress, however long its step.
  double stall_s = 0;
  int32_t activity = kActivityUnknown;  // its last heartbeat's (wire.h)
  std::string waiting_in;               // kActivityWaiting: the operation
  int exit_code = 0;           // kDone: the code its Bye announced
  std::string bye_message;
  std::string dropped_why;     // kLost: why the coordinator dropped it; empty = the connection broke
  bool run_stopped = false;    // its run's stop is decided (it may leave with its run's own code)
};

struct WatchdogLimits {
  double watchdog_s = 120;         // heartbeat silence or job-wide stall this long aborts
  double connect_timeout_s = 120;  // every rank must have connected this long after start
};

// The first reason to abort, or nullopt. Checked in this order, first hit wins:
//  1. a rank's connection dropped without a Bye (process died, node lost, or the coordinator
//     dropped it for not reading: dropped_why)                             -> blame that rank
//  2. a rank said Bye with an exit code other than 0 or 3 (it failed)        -> blame that rank;
//     but 4 (diverged) and 5 (rolled back) from a rank whose run's stop was agreed (run_stopped:
//     the run left the job on its own, as a finished run does) are that run's outcome, not the job's
//  3. a connected rank's last heartbeat is older than watchdog_s             -> blame the oldest
//     (its agent thread beats independently of training, so silence means the process is frozen,
//     stopped or unreachable, not merely busy), naming the ranks of its host silent for over
//     watchdog_s / 2 and their roles (a lost node takes them all); exit code kExitUnreachable
//  4. no connected rank made progress for watchdog_s                          -> blame the rank
//     stalled longest. Job-wide on purpose: ranks wait on each other in collectives, so one hung
//     rank soon stalls all; the first one to stop is the culprit, and a rank legitimately waiting
//     while another loads weights or evaluates (and reports phases) is not blamed. Progress is a
//     new step or phase, or a heartbeat saying the trainer thread computes (activity.h): a lone
//     process computing one long step, or students waiting on a teacher that computes, is alive;
//     ranks all waiting in communicator calls, or blocked outside them using no CPU, are not.
//  5. some rank has not connected connect_timeout_s after start               -> name the lowest
// Example (watchdog_s = 10): ranks 0..3 connected; rank 2 stall 14 s, rank 0 stall 11 s, ranks 1,3
// stall 12 s, heartbeats fresh -> rule 4: "rank 2 on n1 (...), last step 7: no rank has made progress
// for 11.0 s; this one stopped first, 14.0 s ago (limit control.watchdog_s = 10 s)". If rank 0 had
// stall 1 s, nothing fires: it is still working (e.g. loading the teacher) and may unblock the rest.
std::optional<AbortInfo> watchdog_verdict(std::span<const RankView> ranks, double since_start_s,
                                          const WatchdogLimits& limits);

// "rank 3 on node02 (student 3, pid 1234), last step 17" — the prefix of every abort message; a
// student of a shared teacher's job names its run: "rank 5 on node02 (run post-grow, student 0, ...)".
std::string describe_rank(const RankView& rank);

// ---- Coordinated stop -------------------------------------------------------------------------
// Ranks stop once S steps are complete, S being the largest reach any rank announced in its StopAck
// (see agent.h for why every rank can reach S and none is past it). kStopAtFirstStep when no rank
// had begun a step yet: then every rank stops at its first check, which is the same step for all
// because all ranks start from the same checkpoint.
// Examples: reaches {12, 9, 9, 10} -> 12 (teachers run ahead; students catch up to 12);
//           reaches {-1, 5} -> 5; reaches {-1, -1} -> kStopAtFirstStep.
inline constexpr int64_t kStopAtFirstStep = -1;
int64_t decide_stop_step(std::span<const int64_t> reaches);

// A stop per run: the runs of a job sharing one teacher stop at steps of their own (they resume at
// different steps, and one run may leave alone when it diverges). Every rank answers a StopQuery
// with its reach for each run it takes part in (a student: its run; a teacher stage: every run it
// serves); for each run in `scope` (kEveryRun: every run any rank named) not decided already, the
// stop step is decide_stop_step over the reaches named for that run alone.
// Example: acks {teacher: (a, 53), (b, -1)}, {student of a: (a, 52)}, {student of b: (b, 101)},
// scope kEveryRun -> a stops at 53, b at 101: the teacher finishes step 52 for a, then serves b's
// step 100 alone; a run that resumed at 50 no longer trains on to the other run's step.
// Scope "a" -> only a (b goes on); a run in `decided` keeps its step.
RunSteps decide_run_stops(std::span<const RunSteps> acks, const std::string& scope, const RunSteps& decided);

// The stop step of `run` in `steps`, if listed.
std::optional<int64_t> run_step(const RunSteps& steps, const std::string& run);

// True for the role of a teacher stage ("teacher p0 s1"), false for a student ("student 3").
bool is_teacher_role(const std::string& role);

// ---- The job's exit code ----------------------------------------------------------------------
// What a launcher should do with a job whose ranks all left, from their codes; nullopt while a rank
// has not left. A job of several runs (a shared teacher) follows its runs, each run's code being its
// students' (they leave together): any rank's failure wins (a code outside 0, 3, 4, 5: the lowest
// rank's); else a run stopped with a checkpoint (3) makes the job 3, requeue me; else a run rolled
// back (5) makes it 5, rerun me; else a diverged run (4) makes it 4; else 0. Teacher stages' own 0
// or 3 follow from the runs and do not count.
// Examples: students {a: 0, b: 3}, teacher 3 -> 3 (a finished earlier, b needs the requeue);
//           {a: 4, b: 0}, teacher 0 -> 4; {a: 4, b: 3} -> 3; {a: 1, b: 3} -> 1; {a: 5, b: 0} -> 5.
std::optional<int> job_exit_code(std::span<const RankView> ranks);

}  // namespace deepen::control
