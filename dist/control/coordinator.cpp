// Coordinator: Asio server for agents (handshake, heartbeats, stop, watchdog); hosts the /metrics server.
#include "dist/control/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include <boost/asio.hpp>

#include "dist/control/clock.h"
#include "dist/control/framed_connection.h"
#include "dist/control/hmac.h"
#include "dist/control/metrics_server.h"

namespace deepen::control {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// Listening socket on `host:port`; `host` is an address or a name to resolve.
tcp::acceptor make_acceptor(asio::io_context& io, const std::string& host, uint16_t port,
                            const char* what) {
  error_code ec;
  tcp::endpoint ep;
  const auto addr = asio::ip::make_address(host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, port);
  } else {
    tcp::resolver resolver(io);
    const auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty()) {
      throw std::runtime_error(std::string(what) + ": cannot resolve \"" + host + "\": " + ec.message());
    }
    ep = results.begin()->endpoint();
  }
  tcp::acceptor acceptor(io);
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw std::runtime_error(std::string(what) + ": cannot listen on " + host + ":" +
                             std::to_string(port) + ": " + ec.message());
  }
  return acceptor;
}

// The Abort frame for `info`. The message quotes a rank's host, role and Bye text, each up to the
// wire's string bound, so it can exceed that bound itself: it is cut, not refused, or the abort
// would never leave (and encode() would throw on the io thread).
Abort abort_frame(const AbortInfo& info) {
  return Abort{info.rank, info.host.substr(0, kMaxStringBytes), info.step, info.message.substr(0, kMaxStringBytes),
               info.exit_code};
}

}  // namespace

class AgentSession;

struct Coordinator::Impl : std::enable_shared_from_this<Coordinator::Impl> {
  struct Slot {
    RankView view;                 // state, identity, step, phase, metrics (times filled on read)
    Clock::time_point last_frame;
    Clock::time_point last_progress;
    std::weak_ptr<AgentSession> session;
    bool acked = false;            // answered the current StopQuery
    RunSteps reaches;              // its answer: a reach per run it takes part in
  };
  enum class StopState { kNone, kQuerying, kDecided };

  CoordinatorOptions opt;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::optional<MetricsServer> metrics_server;
  asio::steady_timer watchdog_timer{io};
  asio::steady_timer ping_timer{io};
  asio::steady_timer stop_timer{io};
  asio::steady_timer accept_retry{io};
  std::thread thread;
  Endpoint advertised;
  std::optional<Endpoint> metrics_advertised;
  Clock::time_point started = Clock::now();

  // Touched only on the io thread.
  std::set<std::shared_ptr<AgentSession>> sessions;
  size_t pending = 0;   // unauthenticated sessions
  std::string stop_reason;       // of the round under way (or the last one)
  std::string stop_scope;        // kEveryRun or one run's name
  StopState stop_state = StopState::kNone;
  std::deque<std::pair<std::string, std::string>> queued_stops;  // (scope, reason) asked during a round
  bool every_run_decided = false;  // a kEveryRun round has ended: nothing is left to stop
  bool stopping = false;

  // Shared with callers' threads.
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::vector<Slot> slots;
  RunSteps decided;              // every run's agreed stop step, once decided (in decision order)
  std::optional<AbortInfo> abort_info;
  CoordinatorStats counters;
  std::atomic<size_t> live_sessions{0};

  // Log lines about rejected peers are rate-limited: 1000 bad connections must not flood the log.
  Clock::time_point log_window = Clock::now();
  int log_in_window = 0;
  int log_suppressed = 0;

  explicit Impl(CoordinatorOptions o) : opt(std::move(o)) {
    if (opt.world < 1) throw std::invalid_argument("Coordinator: world must be >= 1");
    check_send_queue_bound(opt.max_send_queue_bytes);
    if (opt.connect_timeout_s <= 0) opt.connect_timeout_s = opt.watchdog_s;
    if (!opt.log) opt.log = [](const std::string& line) { std::cerr << line << std::endl; };
    slots.resize(size_t(opt.world));
    for (int r = 0; r < opt.world; ++r) slots[size_t(r)].view.rank = r;
  }

  void log(const std::string& line) { opt.log("deepen control: " + line); }

  void log_limited(const std::string& line) {
    const auto now = Clock::now();
    if (now - log_window > std::chrono::seconds(10)) {
      log_window = now;
      log_in_window = 0;
    }
    if (++log_in_window > 10) {
      ++log_suppressed;
      return;
    }
    std::string prefix;
    if (log_suppressed > 0) {
      prefix = "(" + std::to_string(log_suppressed) + " similar lines suppressed) ";
      log_suppressed = 0;
    }
    log(prefix + line);
  }

  void start();
  void accept();
  void arm_watchdog();
  void arm_ping();
  void check_watchdog();
  void do_abort(const AbortInfo& info);
  void begin_stop(const std::string& reason, const std::string& scope);
  void maybe_decide_stop();
  void broadcast(const Message& m);
  std::vector<RankView> snapshot_locked(Clock::time_point now) const;
  // `dropped_why`: the coordinator dropped an authenticated rank for not reading; empty otherwise.
  void on_session_closed(AgentSession& s, bool authed, int rank, bool said_bye, const std::string& dropped_why);
  std::string public_render() const;
};

// One agent connection: handshake, then frames until Bye, error or close.
class AgentSession : public std::enable_shared_from_this<AgentSession> {
 public:
  AgentSession(Coordinator::Impl& owner, tcp::socket socket)
      : owner_(owner),
        conn_(std::make_shared<FramedConnection>(std::move(socket), owner.opt.max_send_queue_bytes)),
        auth_timer_(owner.io) {}

  void start() {
    ++owner_.live_sessions;
    server_nonce_ = random_nonce();
    // Weak: the connection's pending reads must not keep a session alive that the owner dropped.
    conn_->start(
        [weak = weak_from_this()](Message m) {
          if (auto self = weak.lock()) self->dispatch(std::move(m));
        },
        [weak = weak_from_this()](CloseCause cause, const std::string& why) {
          if (auto self = weak.lock()) self->connection_closed(cause, why);
        });
    send(Challenge{kProtocolVersion, server_nonce_});
    auto self = shared_from_this();
    auth_timer_.expires_after(from_seconds(owner_.opt.auth_timeout_s));
    auth_timer_.async_wait([self](const error_code& ec) {
      if (ec || self->authed_ || self->done_) return;
      {
        std::lock_guard lock(self->owner_.mu);
        ++self->owner_.counters.timed_out;
      }
      self->close("no handshake within control auth timeout");
    });
  }

  void send(const Message& m) { conn_->send(m); }

  // Shutdown: flush what is queued, then close without counting it as a lost rank.
  void close_after_flush() {
    leaving_ = true;
    conn_->close_after_flush();
  }

  void close(const std::string& why) {
    conn_->close();
    finish(why);
  }

  bool authed() const { return authed_; }
  int rank() const { return rank_; }

 private:
  void connection_closed(CloseCause cause, const std::string& why) {
    if (cause == CloseCause::kProtocolError) {
      protocol_error(why);
    } else if (cause == CloseCause::kSendQueueFull && authed_ && !said_bye_ && !leaving_) {
      owner_.log("dropping rank " + std::to_string(rank_) + ": " + why);
      finish(why, why + "; the process is frozen or overloaded");
    } else {
      finish(why);
    }
  }

  void finish(const std::string& why, const std::string& dropped_why = "") {
    if (done_) return;
    done_ = true;
    auth_timer_.cancel();
    --owner_.live_sessions;
    if (!authed_ && !why.empty()) {
      owner_.log_limited("closed unauthenticated connection from " + conn_->remote() + ": " + why);
    }
    owner_.on_session_closed(*this, authed_, rank_, said_bye_ || leaving_, dropped_why);
  }

  void protocol_error(const std::string& what) {
    {
      std::lock_guard lock(owner_.mu);
      ++owner_.counters.protocol_errors;
    }
    const std::string who = authed_ ? "rank " + std::to_string(rank_) : conn_->remote();
    owner_.log_limited("protocol error from " + who + ": " + what);
    conn_->close();
    // An authenticated rank's stream that breaks the protocol (a frame whose MAC fails: injected or
    // altered on the way) is lost as that rank: the job aborts naming it and why, instead of acting on it.
    finish(what, authed_ ? "protocol error on its control connection (" + what + ")" : "");
  }

  void dispatch(Message m) {
    if (!authed_) {
      if (auto* auth = std::get_if<Auth>(&m)) authenticate(*auth);
      else protocol_error(std::string("expected Auth, got ") + message_name(m));
      return;
    }
    const auto now = Clock::now();
    std::unique_lock lock(owner_.mu);
    auto& slot = owner_.slots[size_t(rank_)];
    slot.last_frame = now;
    if (auto* hb = std::get_if<Heartbeat>(&m)) {
      // A trainer thread that computes is progressing, however long its step (activity.h).
      if (hb->step != slot.view.step || hb->phase != slot.view.phase || hb->activity == kActivityComputing)
        slot.last_progress = now;
      slot.view.activity = hb->activity;
      slot.view.waiting_in = std::move(hb->waiting_in);
      slot.view.step = hb->step;
      slot.view.stage = hb->stage;
      slot.view.depth = hb->depth;
      slot.view.phase = std::move(hb->phase);
      slot.view.metrics = std::move(hb->metrics);
      return;
    }
    if (auto* ack = std::get_if<StopAck>(&m)) {
      if (owner_.stop_state == Coordinator::Impl::StopState::kQuerying && !slot.acked) {
        slot.acked = true;
        slot.reaches = std::move(ack->reaches);
        lock.unlock();
        owner_.maybe_decide_stop();
      }
      return;
    }
    if (auto* req = std::get_if<StopRequest>(&m)) {
      lock.unlock();
      owner_.begin_stop(req->reason, req->scope);
      return;
    }
    if (auto* bye = std::get_if<Bye>(&m)) {
      said_bye_ = true;
      slot.view.state = RankState::kDone;
      slot.view.exit_code = bye->exit_code;
      slot.view.bye_message = bye->message;
      // A rank that finished is progress for everyone still here: they wait on it (a teacher in the
      // final barrier while its students evaluate and export) and now have watchdog_s to follow it.
      if (bye->exit_code == 0)
        for (auto& other : owner_.slots) other.last_progress = now;
      lock.unlock();
      owner_.cv.notify_all();
      owner_.log("rank " + std::to_string(rank_) + " left with exit code " +
                 std::to_string(bye->exit_code) + (bye->message.empty() ? "" : ": " + bye->message));
      owner_.maybe_decide_stop();
      owner_.check_watchdog();
      return;  // keep reading until the agent closes
    }
    lock.unlock();
    protocol_error(std::string("unexpected ") + message_name(m) + " from an agent");
  }

  void authenticate(const Auth& auth) {
    auto reject = [&](const std::string& why) {
      {
        std::lock_guard lock(owner_.mu);
        ++owner_.counters.rejected_auth;
      }
      owner_.log_limited("rejected connection from " + conn_->remote() + " claiming rank " +
                         std::to_string(auth.rank) + ": " + why);
      close("");
    };
    if (!digest_equal(agent_mac(owner_.opt.secret, server_nonce_, auth), auth.mac)) {
      return reject("wrong job secret (MAC mismatch)");
    }
    if (auth.world != owner_.opt.world) {
      return reject("world size " + std::to_string(auth.world) + " differs from the coordinator's " +
                    std::to_string(owner_.opt.world));
    }
    if (auth.rank < 0 || auth.rank >= owner_.opt.world) return reject("rank out of range");
    const auto now = Clock::now();
    std::unique_lock lock(owner_.mu);
    auto& slot = owner_.slots[size_t(auth.rank)];
    if (slot.view.state != RankState::kNeverConnected) {
      lock.unlock();
      return reject("rank already connected once; a restarted rank must restart the whole job");
    }
    slot.view.state = RankState::kConnected;
    slot.view.host = auth.host;
    slot.view.role = auth.role;
    slot.view.run = auth.run;
    slot.view.pid = auth.pid;
    slot.last_frame = now;
    slot.last_progress = now;
    slot.session = weak_from_this();
    ++owner_.counters.authenticated;
    const RunSteps decided = owner_.decided;
    const auto aborted = owner_.abort_info;
    lock.unlock();
    authed_ = true;
    rank_ = auth.rank;
    conn_->allow_full_frames();
    auth_timer_.cancel();
    --owner_.pending;
    send(AuthOk{coordinator_mac(owner_.opt.secret, server_nonce_, auth.nonce, auth.rank)});
    const FrameKeys keys = frame_keys(owner_.opt.secret, server_nonce_, auth.nonce, auth.rank);
    conn_->authenticate_frames(keys.coordinator_to_agent, keys.agent_to_coordinator);
    // A rank that joins late still learns what the others already know.
    if (aborted) {
      send(abort_frame(*aborted));
      return;
    }
    if (!decided.empty()) send(Stop{decided, owner_.stop_reason});
    if (owner_.stop_state == Coordinator::Impl::StopState::kQuerying) {
      {
        std::lock_guard relock(owner_.mu);
        slot.acked = false;
      }
      send(StopQuery{});  // outside the lock: a send that closes the session reports to the owner
    }
  }

  Coordinator::Impl& owner_;
  std::shared_ptr<FramedConnection> conn_;
  asio::steady_timer auth_timer_;
  Nonce server_nonce_{};
  bool done_ = false;  // closed and reported to the owner
  bool authed_ = false;
  bool said_bye_ = false;
  bool leaving_ = false;
  int rank_ = -1;
};

std::string Coordinator::Impl::public_render() const {
  std::lock_guard lock(mu);
  std::optional<int64_t> stop;  // the latest step any run stops at (one run: its stop step)
  for (const auto& [run, step] : decided) stop = std::max(stop.value_or(kStopAtFirstStep), step);
  return render_prometheus(snapshot_locked(Clock::now()), stop, abort_info.has_value()) +
         render_coordinator_counters(counters);
}

void Coordinator::Impl::start() {
  acceptor = make_acceptor(io, opt.bind, opt.port, "control coordinator");
  const auto local = acceptor.local_endpoint();
  std::string host = opt.advertise_host;
  if (host.empty()) host = local.address().is_unspecified() ? this_host_name() : opt.bind;
  advertised = Endpoint{host, local.port()};
  if (opt.metrics) {
    const MetricsServerLimits limits{opt.http_timeout_s, opt.http_max_request_bytes, opt.http_max_request_bytes};
    metrics_server.emplace(make_acceptor(io, opt.metrics_bind, opt.metrics_port, "control /metrics"), limits,
                           [this] { return public_render(); },
                           [this] {
                             std::lock_guard lock(mu);
                             ++counters.http_requests;
                           });
    metrics_advertised = Endpoint{opt.metrics_bind, metrics_server->port()};
  }
  accept();
  arm_watchdog();
  arm_ping();
  thread = std::thread([this] { io.run(); });
  log("coordinator listening on " + advertised.str() + " for " + std::to_string(opt.world) + " ranks" +
      (metrics_advertised ? "; metrics on http://" + metrics_advertised->str() + "/metrics" : ""));
}

void Coordinator::Impl::accept() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || stopping) return;
    if (!ec) {
      {
        std::lock_guard lock(mu);
        ++counters.accepted;
        if (pending >= opt.max_pending) ++counters.refused_busy;
      }
      if (pending >= opt.max_pending) {
        error_code ignore;
        socket.close(ignore);
        log_limited("refused a connection: " + std::to_string(pending) + " unauthenticated already");
      } else {
        ++pending;
        auto s = std::make_shared<AgentSession>(*this, std::move(socket));
        sessions.insert(s);
        s->start();
      }
      accept();
      return;
    }
    // Out of descriptors or similar: retrying at once would spin; retry shortly.
    log_limited("accept failed: " + ec.message());
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](const error_code& e) {
      if (!e && !stopping) accept();
    });
  });
}

void Coordinator::Impl::arm_watchdog() {
  const double tick = std::clamp(std::min(opt.watchdog_s, opt.heartbeat_s) / 4, 0.01, 1.0);
  watchdog_timer.expires_after(from_seconds(tick));
  watchdog_timer.async_wait([this](const error_code& ec) {
    if (ec || stopping) return;
    check_watchdog();
    arm_watchdog();
  });
}

void Coordinator::Impl::arm_ping() {
  ping_timer.expires_after(from_seconds(opt.heartbeat_s));
  ping_timer.async_wait([this](const error_code& ec) {
    if (ec || stopping) return;
    Ping ping;
    {
      std::lock_guard lock(mu);
      const auto& host = slots[size_t(std::clamp(opt.host_rank, 0, opt.world - 1))].view;
      ping = Ping{host.rank, host.host, host.step};
    }
    broadcast(ping);
    arm_ping();
  });
}

std::vector<RankView> Coordinator::Impl::snapshot_locked(Clock::time_point now) const {
  std::vector<RankView> views;
  views.reserve(slots.size());
  for (const Slot& s : slots) {
    RankView v = s.view;
    v.run_stopped = run_step(decided, v.run).has_value();
    if (v.state != RankState::kNeverConnected) {
      v.heartbeat_age_s = seconds_between(s.last_frame, now);
      v.stall_s = seconds_between(s.last_progress, now);
    }
    views.push_back(std::move(v));
  }
  return views;
}

void Coordinator::Impl::check_watchdog() {
  std::optional<AbortInfo> verdict;
  {
    std::lock_guard lock(mu);
    if (abort_info || stopping) return;
    const auto now = Clock::now();
    verdict = watchdog_verdict(snapshot_locked(now), seconds_between(started, now),
                               WatchdogLimits{opt.watchdog_s, opt.connect_timeout_s});
  }
  if (verdict) do_abort(*verdict);
}

void Coordinator::Impl::do_abort(const AbortInfo& info) {
  {
    std::lock_guard lock(mu);
    if (abort_info) return;
    abort_info = info;
  }
  cv.notify_all();
  log("ABORT: " + info.message);
  broadcast(abort_frame(info));
}

void Coordinator::Impl::broadcast(const Message& m) {
  const auto copy = sessions;  // send() may close a session, which edits the set
  for (const auto& s : copy) {
    if (s->authed()) s->send(m);
  }
}

void Coordinator::Impl::begin_stop(const std::string& reason, const std::string& scope) {
  {
    std::lock_guard lock(mu);
    if (abort_info) return;
    // A run that is decided stays decided: a second guard request from its other students, or a
    // signal after every run's stop, changes nothing.
    if (every_run_decided || (scope != kEveryRun && run_step(decided, scope))) return;
  }
  const std::string what = scope == kEveryRun ? "every run" : "run " + scope;
  if (stop_state != StopState::kNone) {
    if (scope == stop_scope) {
      log("stop request (" + reason + ") joins the stop already under way");
      return;
    }
    // One round at a time: each freezes every rank's step claims once; the next starts when it ends.
    if (std::none_of(queued_stops.begin(), queued_stops.end(), [&](const auto& q) { return q.first == scope; })) {
      log("stop request for " + what + " (" + reason + ") waits for the stop under way");
      queued_stops.emplace_back(scope, reason);
    }
    return;
  }
  stop_reason = reason;
  stop_scope = scope;
  stop_state = StopState::kQuerying;
  log("coordinated stop of " + what + " requested (" + reason + "); asking every rank how far it can get");
  {
    std::lock_guard lock(mu);
    for (Slot& s : slots) {
      s.acked = false;
      s.reaches.clear();
    }
  }
  broadcast(StopQuery{});
  stop_timer.expires_after(from_seconds(opt.watchdog_s));
  stop_timer.async_wait([this](const error_code& ec) {
    if (ec || stop_state != StopState::kQuerying) return;
    std::optional<AbortInfo> verdict;
    {
      std::lock_guard lock(mu);
      for (const Slot& s : slots) {
        if (s.view.state == RankState::kConnected && !s.acked) {
          verdict = AbortInfo{s.view.rank, s.view.host, s.view.step,
                              describe_rank(s.view) + ": did not answer the stop query within " +
                                  std::to_string(opt.watchdog_s) + " s"};
          break;
        }
      }
    }
    if (verdict) do_abort(*verdict);
  });
  maybe_decide_stop();
}

void Coordinator::Impl::maybe_decide_stop() {
  if (stop_state != StopState::kQuerying) return;
  RunSteps now;
  {
    std::lock_guard lock(mu);
    std::vector<RunSteps> acks;
    for (const Slot& s : slots) {
      if (s.view.state == RankState::kConnected && !s.acked) return;  // still waiting
      if (s.acked) acks.push_back(s.reaches);
    }
    now = decide_run_stops(acks, stop_scope, decided);
    decided.insert(decided.end(), now.begin(), now.end());
    if (stop_scope == kEveryRun) every_run_decided = true;
  }
  stop_state = StopState::kNone;
  stop_timer.cancel();
  cv.notify_all();
  for (const auto& [run, step] : now)
    log("coordinated stop agreed: " + (run.empty() ? std::string("every rank") : "run " + run) + " stops once " +
        (step == kStopAtFirstStep ? std::string("it reaches its first step") : std::to_string(step) + " steps are complete") +
        " (" + stop_reason + ")");
  // Sent even when it decides nothing new: it ends the round, and every rank's claims thaw.
  broadcast(Stop{now, stop_reason});
  if (!queued_stops.empty()) {
    const auto [scope, reason] = queued_stops.front();
    queued_stops.pop_front();
    begin_stop(reason, scope);
  }
}

void Coordinator::Impl::on_session_closed(AgentSession& s, bool authed, int rank, bool said_bye,
                                          const std::string& dropped_why) {
  sessions.erase(s.shared_from_this());
  if (!authed) {
    --pending;
    return;
  }
  if (said_bye || stopping) return;
  {
    std::lock_guard lock(mu);
    Slot& slot = slots[size_t(rank)];
    if (slot.view.state == RankState::kConnected) {
      slot.view.state = RankState::kLost;
      slot.view.dropped_why = dropped_why;
    }
  }
  check_watchdog();
  maybe_decide_stop();
}

Coordinator::Coordinator(CoordinatorOptions options)
    : impl_(std::make_shared<Impl>(std::move(options))) {
  impl_->start();
}

Coordinator::~Coordinator() { stop(); }

Endpoint Coordinator::endpoint() const { return impl_->advertised; }
std::optional<Endpoint> Coordinator::metrics_endpoint() const { return impl_->metrics_advertised; }

std::vector<RankView> Coordinator::ranks() const {
  std::lock_guard lock(impl_->mu);
  return impl_->snapshot_locked(Clock::now());
}

std::optional<int64_t> Coordinator::stop_step() const {
  std::lock_guard lock(impl_->mu);
  return run_step(impl_->decided, "");
}

RunSteps Coordinator::stop_steps() const {
  std::lock_guard lock(impl_->mu);
  return impl_->decided;
}

std::optional<AbortInfo> Coordinator::aborted() const {
  std::lock_guard lock(impl_->mu);
  return impl_->abort_info;
}

CoordinatorStats Coordinator::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->counters;
}

std::string Coordinator::render_metrics() const { return impl_->public_render(); }

bool Coordinator::wait_all_done(double timeout_s) const {
  std::unique_lock lock(impl_->mu);
  auto all_done = [&] {
    return std::all_of(impl_->slots.begin(), impl_->slots.end(),
                       [](const Impl::Slot& s) { return s.view.state == RankState::kDone; });
  };
  const auto settled = [&] { return all_done() || impl_->abort_info.has_value(); };
  if (std::isfinite(timeout_s)) impl_->cv.wait_for(lock, from_seconds(timeout_s), settled);
  else impl_->cv.wait(lock, settled);  // the watchdog aborts the job if a rank never comes
  return all_done();
}

void Coordinator::stop() {
  Impl& im = *impl_;
  if (!im.thread.joinable()) return;
  asio::post(im.io, [&im] {
    im.stopping = true;
    error_code ec;
    im.acceptor.close(ec);
    if (im.metrics_server) im.metrics_server->close();
    im.watchdog_timer.cancel();
    im.ping_timer.cancel();
    im.stop_timer.cancel();
    im.accept_retry.cancel();
    const auto copy = im.sessions;
    for (const auto& s : copy) {
      if (s->authed()) {
        s->send(Shutdown{});
        s->close_after_flush();
      } else {
        s->close("");
      }
    }
  });
  // Give the Shutdown frames a moment to leave, so agents do not take this for a crash.
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (im.live_sessions.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  im.io.stop();
  im.thread.join();
}

}  // namespace deepen::control
