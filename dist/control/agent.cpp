// Agent: connects to the coordinator, heartbeats, answers the stop protocol, aborts on failure.
#include "dist/control/agent.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <thread>

#include <boost/asio.hpp>

#include "config/input_error.h"
#include "dist/control/clock.h"
#include "dist/control/framed_connection.h"
#include "dist/control/hmac.h"
#include "dist/control/stop_signals.h"

namespace deepen::control {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// Handlers capture `this`: the io thread is joined before Impl is destroyed, and a shared_ptr in a
// pending handler would keep Impl (which owns the io_context) alive forever. The connection's own
// pending handlers hold only the connection; its callbacks never run once the io thread is joined.
struct Agent::Impl {
  enum class Link { kIdle, kConnecting, kHandshake, kReady, kClosed };

  AgentOptions opt;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  tcp::socket socket{io};                  // while connecting; then moved into `conn`
  std::shared_ptr<FramedConnection> conn;  // from the TCP connect on
  asio::steady_timer heartbeat_timer{io};
  asio::steady_timer silence_timer{io};
  asio::steady_timer retry_timer{io};
  asio::steady_timer handshake_timer{io};
  asio::steady_timer connect_timer{io};   // the connect deadline, whatever is in flight then
  asio::steady_timer leave_timer{io};
  std::optional<asio::signal_set> signals;
  std::thread thread;

  // io thread only
  Endpoint endpoint;
  Link link = Link::kIdle;
  Clock::time_point connect_deadline;
  Clock::time_point last_heard;
  double retry_s = 0.05;
  std::string last_connect_error;
  int busy_turned_away = 0;           // connections the coordinator closed before its Challenge
  bool leaving = false;               // our own shutdown(): closing is no failure
  bool coordinator_said_shutdown = false;
  Nonce nonce{};
  Nonce server_nonce{};
  bool auth_sent = false;
  Ping last_ping;
  std::vector<StopRequest> early_stop_requests;  // asked before the link was up

  // shared with callers
  mutable std::mutex mu;
  std::condition_variable cv;
  int64_t step = -1, stage = 0, depth = 0;
  std::string phase = "start";
  Metrics metrics;
  int64_t claimed = -1;          // the last step stop_step() / stop_steps() let begin
  bool stop_pending = false;     // StopQuery answered, decision not yet here
  RunSteps decided;              // every run's decided stop step, as the coordinator sent them
  std::optional<int64_t> own_stop;  // this rank's run's (a student): kStopAtFirstStep resolved on first use
  std::vector<ServedRun> served;    // a teacher stage: the runs it serves (set_served_runs)
  bool coordinator_gone = false;
  std::optional<AbortInfo> abort_info;
  enum class Connect { kWaiting, kReady, kFailed } connect_state = Connect::kWaiting;
  std::string connect_error;
  bool flushed = false;

  explicit Impl(AgentOptions o) : opt(std::move(o)) {
    check_send_queue_bound(opt.max_send_queue_bytes);
    if (opt.host.empty()) opt.host = this_host_name();
    if (!opt.log) {
      const std::string prefix = "deepen control[rank " + std::to_string(opt.rank) + "]: ";
      opt.log = [prefix](const std::string& line) { std::cerr << prefix + line << std::endl; };
    }
    thread = std::thread([this] { io.run(); });
  }

  void log(const std::string& line) { opt.log(line); }

  // ---- connection ---------------------------------------------------------------------------
  void start_connect() {
    link = Link::kConnecting;
    tcp::resolver resolver(io);
    error_code ec;
    const auto results = resolver.resolve(endpoint.host, std::to_string(endpoint.port), ec);
    if (ec) {
      retry_or_fail("cannot resolve " + endpoint.host + ": " + ec.message());
      return;
    }
    Impl* self = this;
    std::string addresses;
    for (const auto& r : results) addresses += (addresses.empty() ? "" : ", ") + r.endpoint().address().to_string();
    last_connect_error = "no answer from " + endpoint.host + " (" + addresses +
                         "): a cut link, a firewall, or an address this node cannot reach";
    asio::async_connect(socket, results, [self](const error_code& ec, const tcp::endpoint&) {
      if (self->link != Link::kConnecting) return;
      if (ec) {
        self->retry_or_fail(ec.message());
        return;
      }
      self->link = Link::kHandshake;
      self->handshake_timer.expires_after(from_seconds(std::min(10.0, self->opt.watchdog_s)));
      self->handshake_timer.async_wait([self](const error_code& ec) {
        if (!ec && self->link == Link::kHandshake) self->fail_connect("no handshake from the coordinator in time");
      });
      self->conn = std::make_shared<FramedConnection>(std::move(self->socket), self->opt.max_send_queue_bytes);
      self->conn->start([self](Message m) { self->handle(std::move(m)); },
                        [self](CloseCause cause, const std::string& why) { self->closed(cause, why); });
    });
  }

  void retry_or_fail(const std::string& error) {
    last_connect_error = error;
    error_code ignore;
    socket.close(ignore);
    if (Clock::now() + from_seconds(retry_s) > connect_deadline) {
      fail_connect("cannot connect within control connect timeout " + seconds_text(opt.connect_timeout_s) + ": " +
                   error + " (is DEEPEN_COORDINATOR right, and the coordinator's rank alive?)");
      return;
    }
    retry_timer.expires_after(from_seconds(retry_s));
    retry_s = std::min(retry_s * 2, 1.0);
    Impl* self = this;
    retry_timer.async_wait([self](const error_code& ec) {
      if (!ec && self->link == Link::kConnecting) self->start_connect();
    });
  }

  // The connect timeout bounds everything before the link is up: a connect that the network never
  // answers (a cut link drops the SYN; the kernel would retry for minutes) ends here with a named error.
  void arm_connect_deadline() {
    connect_timer.expires_at(connect_deadline);
    Impl* self = this;
    connect_timer.async_wait([self](const error_code& ec) {
      if (ec || (self->link != Link::kConnecting && self->link != Link::kHandshake)) return;
      self->fail_connect("cannot connect within control connect timeout " + seconds_text(self->opt.connect_timeout_s) +
                         ": " + (self->link == Link::kHandshake ? "no handshake from the coordinator"
                                                                 : self->last_connect_error));
    });
  }

  static std::string seconds_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f s", s);
    return buf;
  }

  void fail_connect(const std::string& why) {
    link = Link::kClosed;
    error_code ignore;
    socket.close(ignore);
    if (conn) conn->close();
    handshake_timer.cancel();
    retry_timer.cancel();
    connect_timer.cancel();
    {
      std::lock_guard lock(mu);
      connect_state = Connect::kFailed;
      connect_error = "rank " + std::to_string(opt.rank) + " on " + opt.host + ": coordinator at " + endpoint.str() +
                      ": " + why;
    }
    cv.notify_all();
  }

  void became_ready() {
    link = Link::kReady;
    conn->allow_full_frames();
    handshake_timer.cancel();
    connect_timer.cancel();
    if (busy_turned_away > 0)
      log("connected to the coordinator after it turned " + std::to_string(busy_turned_away) +
          " connection(s) away as busy");
    last_heard = Clock::now();
    {
      std::lock_guard lock(mu);
      connect_state = Connect::kReady;
    }
    cv.notify_all();
    send_heartbeat();
    arm_heartbeat();
    arm_silence();
    for (const auto& request : early_stop_requests) send(request);
    early_stop_requests.clear();
  }

  // ---- frames -------------------------------------------------------------------------------
  void send(const Message& m) {
    if (link != Link::kClosed && conn) conn->send(m);
  }

  void finish_leaving() {
    if (conn) conn->close();
    link = Link::kClosed;
    {
      std::lock_guard lock(mu);
      flushed = true;
    }
    cv.notify_all();
  }

  // The connection closed by itself: the coordinator went away, broke the protocol, or stopped
  // reading (the send-queue bound, see framed_connection.h).
  void closed(CloseCause cause, const std::string& why) {
    if (leaving) {  // our Bye is out, or cannot go out any more: either way we are done
      finish_leaving();
    } else if (link == Link::kHandshake) {
      const bool peer_closed = cause == CloseCause::kPeerClosed || cause == CloseCause::kReadFailed;
      if (peer_closed && !auth_sent) {
        // Closed before its Challenge: the coordinator has control.max_pending unauthenticated
        // connections waiting (a burst of ranks from other nodes, or a local client holding them)
        // and turns new ones away at once. Busy, not wrong: connect again within the timeout.
        handshake_timer.cancel();
        conn.reset();
        link = Link::kConnecting;
        if (busy_turned_away++ == 0)
          log("the coordinator at " + endpoint.str() + " is busy (it closed the connection before its challenge: "
              "too many unauthenticated connections waiting); retrying for up to " +
              seconds_text(opt.connect_timeout_s) + " from the first attempt");
        retry_or_fail("busy: the coordinator turned the connection away " + std::to_string(busy_turned_away) +
                      " time(s) before its challenge (control.max_pending unauthenticated connections waiting)");
      } else if (cause == CloseCause::kProtocolError) {
        fail_connect("protocol error during the handshake: " + why);
      } else if (peer_closed && auth_sent) {
        fail_connect("closed the connection during the handshake: wrong job secret, rank already connected, "
                     "or world size mismatch (the coordinator's log says which)");
      } else {
        fail_connect((peer_closed ? "closed the connection before the handshake: " : "during the handshake: ") + why);
      }
    } else if (link == Link::kReady) {
      if (cause == CloseCause::kProtocolError) link_lost("protocol error: " + why);
      else if (cause == CloseCause::kSendQueueFull) link_lost(why, "it is frozen or overloaded");
      else link_lost(why);
    }
  }

  void handle(Message m) {
    if (link == Link::kHandshake) {
      if (!auth_sent) {
        auto* challenge = std::get_if<Challenge>(&m);
        if (!challenge || challenge->version != kProtocolVersion) {
          fail_connect(challenge ? "protocol version " + std::to_string(challenge->version) +
                                       " differs from ours (" + std::to_string(kProtocolVersion) + ")"
                                 : std::string("expected Challenge, got ") + message_name(m));
          return;
        }
        server_nonce = challenge->nonce;
        nonce = random_nonce();
        Auth auth{opt.rank, opt.world, int64_t(::getpid()), opt.host, opt.role, opt.run, nonce, {}};
        auth.mac = agent_mac(opt.secret, server_nonce, auth);
        auth_sent = true;
        send(auth);
        return;
      }
      auto* ok = std::get_if<AuthOk>(&m);
      if (!ok || !digest_equal(ok->mac, coordinator_mac(opt.secret, server_nonce, nonce, opt.rank))) {
        fail_connect(ok ? "the coordinator failed to prove it knows the job secret (another job's?)"
                        : std::string("expected AuthOk, got ") + message_name(m));
        return;
      }
      const FrameKeys keys = frame_keys(opt.secret, server_nonce, nonce, opt.rank);
      conn->authenticate_frames(keys.agent_to_coordinator, keys.coordinator_to_agent);
      became_ready();
      return;
    }
    last_heard = Clock::now();
    if (auto* ping = std::get_if<Ping>(&m)) {
      last_ping = *ping;
    } else if (std::holds_alternative<StopQuery>(m)) {
      StopAck ack;
      {
        std::lock_guard lock(mu);
        ack.reaches = reaches_locked();
        // Claims freeze until the decision, unless every run of this rank is decided already.
        stop_pending = std::any_of(ack.reaches.begin(), ack.reaches.end(),
                                   [&](const auto& r) { return !run_step(decided, r.first); });
      }
      send(ack);
    } else if (auto* s = std::get_if<Stop>(&m)) {
      std::string mine;
      {
        std::lock_guard lock(mu);
        for (const auto& [run, step] : s->steps) {
          if (run_step(decided, run)) continue;
          decided.emplace_back(run, step);
          if (takes_part_locked(run))
            mine += (mine.empty() ? "" : ", ") + (run.empty() ? std::string() : "run " + run + " ") +
                    (step == kStopAtFirstStep ? std::string("at its first step") : "at step " + std::to_string(step));
        }
        stop_pending = false;
      }
      cv.notify_all();
      if (!mine.empty()) log("coordinated stop: " + mine + " (" + s->reason + ")");
    } else if (auto* a = std::get_if<Abort>(&m)) {
      if (leaving) {  // our own failure's Abort, back from the coordinator: the others have it too
        finish_leaving();
        return;
      }
      do_abort(AbortInfo{a->rank, a->host, a->step, a->message, a->exit_code});
    } else if (std::holds_alternative<Shutdown>(m)) {
      coordinator_said_shutdown = true;
    } else {
      link_lost(std::string("unexpected ") + message_name(m) + " from the coordinator");
    }
  }

  // This rank's reach for each run it takes part in (see Agent::stop_step and set_served_runs): a
  // student's claim + 1; a teacher stage's claim of the global step, seen from each run it serves.
  RunSteps reaches_locked() const {
    if (served.empty()) return {{opt.run, claimed >= 0 ? claimed + 1 : -1}};
    RunSteps out;
    for (const ServedRun& r : served) {
      int64_t reach = -1;                                 // not begun a step of this run
      if (claimed >= r.end_step) reach = r.end_step;      // served it to its end
      else if (claimed >= r.first_step) reach = claimed + 1;
      out.emplace_back(r.name, reach);
    }
    return out;
  }

  bool takes_part_locked(const std::string& run) const {
    if (served.empty()) return run == opt.run;
    return std::any_of(served.begin(), served.end(), [&](const ServedRun& r) { return r.name == run; });
  }

  void link_lost(const std::string& why, const std::string& likely = "its process died or its node failed",
                 int exit_code = kExitFailure) {
    if (link == Link::kClosed) return;
    link = Link::kClosed;
    conn->close();
    heartbeat_timer.cancel();
    silence_timer.cancel();
    {
      std::lock_guard lock(mu);
      coordinator_gone = true;
    }
    cv.notify_all();
    if (leaving) return;
    if (coordinator_said_shutdown) {
      log("the coordinator closed the job's control plane");
      return;
    }
    AbortInfo info = lost_coordinator("lost the control connection to the coordinator at " + endpoint.str() +
                                      " (" + why + "); " + likely);
    info.exit_code = exit_code;
    do_abort(info);
  }

  AbortInfo lost_coordinator(const std::string& what) const {
    AbortInfo info{last_ping.host_rank, last_ping.host, last_ping.host_step, ""};
    if (last_ping.host_rank >= 0) {
      RankView host;
      host.rank = last_ping.host_rank;
      host.host = last_ping.host;
      host.step = last_ping.host_step;
      info.message = describe_rank(host) + " (hosting the coordinator): " + what;
    } else {
      info.message = what;
    }
    return info;
  }

  // ---- timers -------------------------------------------------------------------------------
  void send_heartbeat() {
    Heartbeat hb;
    {
      std::lock_guard lock(mu);
      hb.step = step;
      hb.stage = stage;
      hb.depth = depth;
      hb.phase = phase;
      for (const auto& [k, v] : metrics) {
        if (hb.metrics.size() == kMaxMetrics) break;
        hb.metrics.emplace_back(k.substr(0, kMaxMetricName), v);
      }
    }
    if (hb.phase.size() > kMaxStringBytes) hb.phase.resize(kMaxStringBytes);
    if (opt.activity) {
      const TrainerActivity::Sample s = opt.activity->sample();
      hb.activity = s.state == TrainerActivity::State::kComputing ? kActivityComputing
                    : s.state == TrainerActivity::State::kWaiting ? kActivityWaiting
                                                                   : kActivityBlocked;
      hb.waiting_in = s.what.substr(0, kMaxStringBytes);
    }
    send(hb);
  }

  void arm_heartbeat() {
    heartbeat_timer.expires_after(from_seconds(opt.heartbeat_s));
    Impl* self = this;
    heartbeat_timer.async_wait([self](const error_code& ec) {
      if (ec || self->link != Link::kReady || self->leaving) return;
      self->send_heartbeat();
      self->arm_heartbeat();
    });
  }

  void arm_silence() {
    silence_timer.expires_after(from_seconds(std::min(opt.heartbeat_s, opt.watchdog_s / 4)));
    Impl* self = this;
    silence_timer.async_wait([self](const error_code& ec) {
      if (ec || self->link != Link::kReady) return;
      const double quiet = std::chrono::duration<double>(Clock::now() - self->last_heard).count();
      if (quiet > self->opt.watchdog_s) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.1f s", quiet);
        // Silence with the connection open: the coordinator's node is lost or cut off (kExitUnreachable).
        self->link_lost(std::string("silent for ") + buf + ", over control.watchdog_s",
                        "its node is lost or unreachable from " + self->opt.host + " (a cut link), or it is frozen",
                        kExitUnreachable);
        return;
      }
      self->arm_silence();
    });
  }

  void arm_signals() {
    signals->async_wait([self = this](const error_code& ec, int signo) {
      if (ec) return;
      self->request_stop_io(self->signal_reason(signo));
      self->arm_signals();
    });
  }

  // "SIGUSR1 on rank 3 (node07)": what a signalled stop says, here and in every rank's log.
  std::string signal_reason(int signo) const {
    return std::string(signo == SIGTERM ? "SIGTERM" : "SIGUSR1") + " on rank " + std::to_string(opt.rank) + " (" +
           opt.host + ")";
  }

  void request_stop_io(const std::string& reason, const std::string& scope = kEveryRun) {
    log("stop requested" + (scope == kEveryRun ? std::string() : " for run " + scope) + ": " + reason);
    // The wire's bounds; the log has it all.
    const StopRequest request{reason.substr(0, kMaxStringBytes), scope.substr(0, kMaxRunName)};
    if (link == Link::kReady) send(request);
    else early_stop_requests.push_back(request);
  }

  // ---- abort --------------------------------------------------------------------------------
  void do_abort(const AbortInfo& info) {
    {
      std::lock_guard lock(mu);
      if (abort_info) return;
      // Said before anyone can see the abort: a trainer that reacts by ending the process (exit 1)
      // cut the line off when it came after (ControlWatchdog.FrozenProcessAborts... in a CI run).
      log("ABORT: " + info.message);
      abort_info = info;
    }
    cv.notify_all();
    if (opt.hard_exit_after_s >= 0) {
      std::thread([grace = opt.hard_exit_after_s, message = info.message, code = info.exit_code] {
        std::this_thread::sleep_for(from_seconds(grace));
        std::fprintf(stderr, "deepen control: still alive %.1f s after the abort, exiting with code %d: %s\n",
                     grace, code, message.c_str());
        std::fflush(stderr);
        std::_Exit(code);
      }).detach();
    }
    if (opt.on_abort) {
      try {
        opt.on_abort(info);
      } catch (const std::exception& e) {
        log(std::string("abort handler threw: ") + e.what());
      }
    }
  }
};

Agent::Agent(AgentOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}

Agent::~Agent() {
  Impl& im = *impl_;
  if (!im.thread.joinable()) return;
  im.io.stop();
  im.thread.join();
  error_code ignore;
  im.socket.close(ignore);
  if (im.conn) im.conn->close();
}

void Agent::connect(const Endpoint& coordinator) {
  Impl& im = *impl_;
  asio::post(im.io, [&im, coordinator] {
    im.endpoint = coordinator;
    im.connect_deadline = Clock::now() + from_seconds(im.opt.connect_timeout_s);
    im.arm_connect_deadline();
    if (im.opt.handle_signals && !im.signals) {
      im.signals.emplace(im.io, SIGTERM, SIGUSR1);
      im.arm_signals();
      // A stop signal that came while the job was starting (catch_early_stop_signals) counts now.
      if (const int signo = take_early_stop_signal())
        im.request_stop_io(im.signal_reason(signo) + ", while it was starting");
    }
    im.start_connect();
  });
  std::unique_lock lock(im.mu);
  im.cv.wait(lock, [&] { return im.connect_state != Impl::Connect::kWaiting; });
  if (im.connect_state == Impl::Connect::kFailed) throw ControlError(im.connect_error);
}

void Agent::report(int64_t step, int64_t stage, int64_t depth, const Metrics& metrics,
                   const std::string& phase) {
  std::lock_guard lock(impl_->mu);
  impl_->step = step;
  impl_->stage = stage;
  impl_->depth = depth;
  impl_->metrics = metrics;
  impl_->phase = phase;
}

std::optional<int64_t> Agent::stop_step(int64_t step) {
  Impl& im = *impl_;
  std::unique_lock lock(im.mu);
  while (true) {
    if (im.abort_info) throw ControlError(im.abort_info->message);
    if (!im.own_stop) im.own_stop = run_step(im.decided, im.opt.run);
    if (im.own_stop) {
      if (*im.own_stop == kStopAtFirstStep) im.own_stop = step;  // no rank had begun: all start here
      if (step > *im.own_stop) {
        throw std::logic_error("control: stop_step(" + std::to_string(step) + ") after the agreed stop step " +
                               std::to_string(*im.own_stop) + ": stop_step() must be called at every step");
      }
      return im.own_stop;
    }
    if (!im.stop_pending) {
      im.claimed = std::max(im.claimed, step);
      return std::nullopt;
    }
    if (im.coordinator_gone) throw ControlError("control: the coordinator went away during a coordinated stop");
    im.cv.wait(lock);
  }
}

RunSteps Agent::stop_steps(int64_t step) {
  Impl& im = *impl_;
  std::unique_lock lock(im.mu);
  while (true) {
    if (im.abort_info) throw ControlError(im.abort_info->message);
    if (!im.stop_pending) {
      im.claimed = std::max(im.claimed, step);
      return im.decided;
    }
    if (im.coordinator_gone) throw ControlError("control: the coordinator went away during a coordinated stop");
    im.cv.wait(lock);
  }
}

void Agent::set_served_runs(std::vector<ServedRun> runs) {
  std::lock_guard lock(impl_->mu);
  impl_->served = std::move(runs);
}

void Agent::request_stop(const std::string& reason) {
  asio::post(impl_->io, [im = impl_.get(), reason] { im->request_stop_io(reason); });
}

int64_t Agent::leave_run(const std::string& reason) {
  Impl& im = *impl_;
  asio::post(im.io, [&im, reason] { im.request_stop_io(reason, im.opt.run); });
  std::unique_lock lock(im.mu);
  while (true) {
    if (im.abort_info) throw ControlError(im.abort_info->message);
    if (const auto step = run_step(im.decided, im.opt.run)) return *step;
    if (im.coordinator_gone) throw ControlError("control: the coordinator went away while run " + im.opt.run + " left the job");
    im.cv.wait(lock);
  }
}

std::optional<int64_t> Agent::decided_stop_step() const {
  std::lock_guard lock(impl_->mu);
  return run_step(impl_->decided, impl_->opt.run);
}

std::optional<AbortInfo> Agent::aborted() const {
  std::lock_guard lock(impl_->mu);
  return impl_->abort_info;
}

void Agent::shutdown(int exit_code, const std::string& message) {
  Impl& im = *impl_;
  if (!im.thread.joinable()) return;
  asio::post(im.io, [&im, exit_code, message] {
    im.leaving = true;
    im.heartbeat_timer.cancel();
    im.silence_timer.cancel();
    im.retry_timer.cancel();
    im.connect_timer.cancel();
    if (im.link == Impl::Link::kReady) {
      im.send_heartbeat();  // the coordinator's last view is the final step, not one a beat old
      im.send(Bye{exit_code, message.substr(0, kMaxStringBytes)});
      bool aborted;
      {
        std::lock_guard lock(im.mu);
        aborted = im.abort_info.has_value();
      }
      if (exit_code == 0 || exit_code == 3 || aborted) {
        im.conn->close_after_flush();  // then closed(): finish_leaving
        return;
      }
      // A failure: the coordinator answers this Bye by aborting every rank with its message. Stay
      // until that Abort comes back (handle(): finish_leaving), so the others have it before this
      // process exits: a launcher that kills the job at the first non-zero exit (mpirun) would
      // otherwise cut them off with "the process died" instead of the reason.
      im.leave_timer.expires_after(std::chrono::seconds(2));
      im.leave_timer.async_wait([&im](const error_code& ec) {
        if (!ec && im.link != Impl::Link::kClosed) im.conn->close_after_flush();
      });
    } else {
      im.finish_leaving();
    }
  });
  {
    std::unique_lock lock(im.mu);
    im.cv.wait_for(lock, std::chrono::seconds(3), [&] { return im.flushed; });
  }
  im.io.stop();
  im.thread.join();
}

}  // namespace deepen::control
