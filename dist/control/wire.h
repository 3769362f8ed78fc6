// Control-plane wire format: length-prefixed, size-bounded binary frames and their strict parser.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace deepen::control {

// A frame is a 4-byte big-endian body length, then the body: one type byte and the fields in the
// order each struct's fields() lists them. Integers are big-endian, doubles are IEEE-754 bits
// big-endian, strings are a u16 length and bytes, nonces and MACs are 32 raw bytes, the metric map is
// a u16 count of (string, double). The parser rejects anything else (unknown type, short or
// trailing bytes, over-long strings): a peer that sends it gets its connection closed.
inline constexpr uint16_t kProtocolVersion = 6;  // 2: Auth carries the run; 3: Abort carries the exit code;
                                                 // 4: Heartbeat.activity, waiting_in; 5: a MAC on every
                                                 // frame after the handshake (framed_connection.h);
                                                 // 6: stops per run
inline constexpr uint32_t kFrameMacBytes = 32;   // HMAC-SHA256 after the body of each such frame
inline constexpr uint32_t kMaxFrameBytes = 64 * 1024;  // body bytes after the authenticated handshake
inline constexpr uint32_t kMaxHandshakeBytes = 1024;   // body bytes before it: Auth is small
inline constexpr size_t kMaxStringBytes = 4096;        // host names, phases, reasons, messages
inline constexpr size_t kMaxMetrics = 256;             // entries in one heartbeat's metric map
inline constexpr size_t kMaxMetricName = 128;
inline constexpr size_t kMaxRuns = 256;                // entries in one per-run list (runs of one job)
inline constexpr size_t kMaxRunName = 255;             // a run's name in such a list
// Unsent bytes one connection may hold, per end, before its peer counts as no longer reading (the
// policy: framed_connection.h). 16 largest frames; ordinary traffic is a few hundred bytes a beat.
inline constexpr size_t kDefaultMaxSendQueueBytes = 1 << 20;

using Nonce = std::array<uint8_t, 32>;
using Mac = std::array<uint8_t, 32>;
using MetricList = std::vector<std::pair<std::string, double>>;
// A step per run of the job, by run name ("" for the one run of a job that trains one): the reach
// each rank announces for the runs it takes part in, and the stop steps the coordinator decides.
using RunSteps = std::vector<std::pair<std::string, int64_t>>;
// StopRequest::scope that stops every run of the job (a run's name cannot be "*": folder names only).
inline constexpr const char* kEveryRun = "*";

// Thrown by decode() and read_frame_length() on malformed input. Never crosses a connection: the
// session that hit it is closed.
class ProtocolError : public std::runtime_error {
 public:
  explicit ProtocolError(const std::string& what) : std::runtime_error(what) {}
};

// coordinator -> agent, first frame on every connection: the server's half of the handshake.
struct Challenge {
  uint16_t version = kProtocolVersion;
  Nonce nonce{};
  template <class F> void fields(F& f) { f(version); f(nonce); }
};

// agent -> coordinator: who I am, and a MAC over the server nonce, my nonce and these fields.
struct Auth {
  int32_t rank = 0;
  int32_t world = 0;
  int64_t pid = 0;
  std::string host;
  std::string role;  // "teacher p0 s1", "student 3", ...: shown in /metrics labels and messages
  std::string run;   // the run a student trains ("" for a teacher, or a job of one run)
  Nonce nonce{};
  Mac mac{};
  template <class F> void fields(F& f) {
    f(rank); f(world); f(pid); f(host); f(role); f(run); f(nonce); f(mac);
  }
};

// coordinator -> agent: proves the coordinator knows the secret too (mutual authentication).
struct AuthOk {
  Mac mac{};
  template <class F> void fields(F& f) { f(mac); }
};

// agent -> coordinator, every heartbeat_s: the trainer's last report.
struct Heartbeat {
  int64_t step = -1;   // optimizer steps completed; -1 = not started yet
  int64_t stage = 0;
  int64_t depth = 0;
  std::string phase;   // free text; a change counts as progress for the stall watchdog
  MetricList metrics;
  // What the trainer thread did since the last beat (dist/control/activity.h): kActivityUnknown (no
  // TrainerActivity), kActivityComputing (counts as progress), kActivityWaiting (in `waiting_in`),
  // kActivityBlocked (outside any wait, using no CPU).
  int32_t activity = 0;
  std::string waiting_in;
  template <class F> void fields(F& f) { f(step); f(stage); f(depth); f(phase); f(activity); f(waiting_in); f(metrics); }
};
inline constexpr int32_t kActivityUnknown = 0, kActivityComputing = 1, kActivityWaiting = 2, kActivityBlocked = 3;

// agent -> coordinator: a signal asks for a coordinated stop of every run (scope kEveryRun), or a
// run's students ask to stop that run alone (scope = its name: the divergence guard ended it).
struct StopRequest {
  std::string reason;
  std::string scope = kEveryRun;
  template <class F> void fields(F& f) { f(reason); f(scope); }
};

// coordinator -> agent: freeze your step claims and tell me how far you can get (see agent.h).
struct StopQuery {
  template <class F> void fields(F&) {}
};

// agent -> coordinator: for each run this rank takes part in, the steps it will have completed
// before it next asks stop_step() (-1 = it has not begun a step of that run yet).
struct StopAck {
  RunSteps reaches;
  template <class F> void fields(F& f) { f(reaches); }
};

// coordinator -> agent: each listed run stops once its step count is complete (kStopAtFirstStep:
// no rank had begun a step of it; stop at your first check). Runs not listed go on.
struct Stop {
  RunSteps steps;
  std::string reason;
  template <class F> void fields(F& f) { f(steps); f(reason); }
};

// coordinator -> agent: the job is lost; abort the communicators and exit non-zero.
struct Abort {
  int32_t rank = -1;  // the rank at fault; -1 = not one rank (e.g. several never connected)
  std::string host;
  int64_t step = -1;
  std::string message;
  int32_t exit_code = 1;  // what every rank exits with: the failed rank's own (its Bye's), else 1
  template <class F> void fields(F& f) { f(rank); f(host); f(step); f(message); f(exit_code); }
};

// agent -> coordinator: this rank is leaving on purpose, with this exit code.
struct Bye {
  int32_t exit_code = 0;
  std::string message;
  template <class F> void fields(F& f) { f(exit_code); f(message); }
};

// coordinator -> agent, every heartbeat_s: I am alive; and the hosting rank's state, so that an
// agent that loses the coordinator can name that rank, its host and its last step.
struct Ping {
  int32_t host_rank = -1;
  std::string host;
  int64_t host_step = -1;
  template <class F> void fields(F& f) { f(host_rank); f(host); f(host_step); }
};

// coordinator -> agent: the coordinator closes on purpose; losing it now is not a failure.
struct Shutdown {
  template <class F> void fields(F&) {}
};

using Message = std::variant<Challenge, Auth, AuthOk, Heartbeat, StopRequest, StopQuery, StopAck,
                             Stop, Abort, Bye, Ping, Shutdown>;

// Body (type byte + fields), without the length prefix. Throws ProtocolError if a field is over
// its bound (the sender's bug, caught before it reaches the wire).
std::vector<uint8_t> encode(const Message& message);

// Length prefix + body: what goes on the wire.
std::vector<uint8_t> encode_frame(const Message& message);

// Parses one body. Throws ProtocolError on anything but an exact, well-formed message.
Message decode(std::span<const uint8_t> body);

// The body length announced by a 4-byte prefix; throws ProtocolError if 0 or above `max_bytes`.
uint32_t read_frame_length(const std::array<uint8_t, 4>& prefix, uint32_t max_bytes);

// Short name of a message type, for logs ("Heartbeat").
const char* message_name(const Message& message);

}  // namespace deepen::control
