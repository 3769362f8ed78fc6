// Coordinator: the one server every rank's Agent connects to; heartbeats, watchdog, stop, /metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/control/endpoint.h"
#include "dist/control/policy.h"
#include "dist/control/secret.h"

namespace deepen::control {

struct CoordinatorOptions {
  int world = 1;                    // ranks expected to connect: 0 .. world-1
  int host_rank = 0;                // the rank whose process hosts this coordinator (named in Pings)
  Secret secret{};
  std::string bind = "127.0.0.1";   // listening address; "0.0.0.0" for a multi-node job
  uint16_t port = 0;                // 0 = a free port, chosen by the kernel; see endpoint()
  std::string advertise_host;       // host in endpoint(); empty = bind, or this host's name if bind
                                    // is a wildcard address
  double heartbeat_s = 5;           // Ping period, and the watchdog's tick is a fraction of it
  double watchdog_s = 120;          // see watchdog_verdict()
  double connect_timeout_s = 0;     // every rank connected by then; 0 = watchdog_s
  double auth_timeout_s = 5;        // a connection that has not authenticated by then is dropped
  size_t max_pending = 64;          // unauthenticated connections at once; more are closed at once
  // Per agent: unsent bytes once the kernel's buffers are full; past it that rank counts as lost
  // (it stopped reading) and the job aborts naming it. The policy: dist/control/framed_connection.h.
  size_t max_send_queue_bytes = kDefaultMaxSendQueueBytes;
  bool metrics = false;             // serve GET /metrics
  std::string metrics_bind = "127.0.0.1";
  uint16_t metrics_port = 0;        // 0 = a free port; see metrics_endpoint()
  double http_timeout_s = 5;        // a scrape must send its whole request within this
  size_t http_max_request_bytes = 8192;  // bound on a request's headers (431 past it) and, apart, on
                                         // its body (413); dist/control/metrics_server.h
  std::function<void(const std::string&)> log;  // one line per event; default: stderr
};

// Counters, for tests and the coordinator's own /metrics lines (render_coordinator_counters).
struct CoordinatorStats {
  uint64_t accepted = 0;         // TCP connections accepted
  uint64_t authenticated = 0;
  uint64_t rejected_auth = 0;    // wrong MAC (wrong secret), wrong world, bad or duplicate rank
  uint64_t protocol_errors = 0;  // bad length prefix, unparsable frame, unexpected message
  uint64_t timed_out = 0;        // no handshake within auth_timeout_s
  uint64_t refused_busy = 0;     // over max_pending
  uint64_t http_requests = 0;    // /metrics requests answered, whatever the status
};

class Coordinator {
 public:
  // Binds (throws std::runtime_error naming the address on failure) and serves on its own thread.
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();  // stop()
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Where agents connect: advertise_host and the bound port. Publish it (MPI broadcast or
  // write_endpoint_file) before agents connect().
  Endpoint endpoint() const;
  std::optional<Endpoint> metrics_endpoint() const;

  // Snapshot of what is known about every rank (index = rank).
  std::vector<RankView> ranks() const;
  // The agreed stop step of the job's one run (run name ""), once decided.
  std::optional<int64_t> stop_step() const;
  // Every run's agreed stop step, once decided (a job sharing a teacher stops its runs one by one).
  RunSteps stop_steps() const;
  std::optional<AbortInfo> aborted() const;
  CoordinatorStats stats() const;

  // The /metrics body (Prometheus text exposition format 0.0.4).
  std::string render_metrics() const;

  // Blocks until every rank said Bye, or the job aborted, or timeout_s passed (infinity: no limit;
  // the watchdog still aborts the job if a rank hangs). True if all said Bye.
  bool wait_all_done(double timeout_s) const;

  // Sends Shutdown to every agent (so losing the coordinator is no failure for them), closes all
  // connections and joins the thread. Idempotent.
  void stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The metric families /metrics serves, rendered from a snapshot; exposed for tests.
// Trainer metrics become deepen_<name> (characters outside [a-zA-Z0-9_] become '_'); names that
// clash with a built-in family get a "metric_" prefix.
std::string render_prometheus(const std::vector<RankView>& ranks, std::optional<int64_t> stop_step,
                              bool aborted);

// The coordinator's own counters (CoordinatorStats) as Prometheus counters, appended to /metrics:
// deepen_control_connections_total{outcome=...} and deepen_control_http_requests_total. What an
// operator watches when the coordinator listens on a cluster network: rejected_auth and
// protocol_errors count strangers and forgeries, refused_busy a flood, timed_out half-open peers.
std::string render_coordinator_counters(const CoordinatorStats& stats);

}  // namespace deepen::control
