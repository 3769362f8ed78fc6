// Control plane over real loopback sockets and real processes: hostile peers, the watchdog (SIGKILL,
// SIGSTOP, stalls, a lost coordinator), the coordinated stop (signals, racing ranks), /metrics.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "dist/control/agent.h"
#include "dist/control/control_plane.h"
#include "dist/control/coordinator.h"
#include "dist/control/policy.h"
#include "dist/control/wire.h"
#include "launch/input_error.h"
#include "tests/base/control_test_util.h"
#include "tests/test_paths.h"

namespace deepen::control {
namespace {

using test::eventually;

// ---- fixtures ---------------------------------------------------------------------------------

// Thread-safe log capture, so tests can check what was logged and keep the output quiet.
struct LogSink {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& l) {
      std::lock_guard lock(mu);
      lines.push_back(l);
    };
  }
  bool contains(const std::string& needle) {
    std::lock_guard lock(mu);
    for (const auto& l : lines) if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

CoordinatorOptions fast_coordinator(int world, const Secret& secret, LogSink& log) {
  CoordinatorOptions o;
  o.world = world;
  o.secret = secret;
  o.bind = "127.0.0.1";
  o.heartbeat_s = 0.05;
  o.watchdog_s = 3.0;  // generous: ctest runs tests in parallel on small machines
  o.connect_timeout_s = 10;
  o.auth_timeout_s = 0.3;
  o.log = log.fn();
  return o;
}

AgentOptions fast_agent(int rank, int world, const Secret& secret, LogSink& log) {
  AgentOptions o;
  o.rank = rank;
  o.world = world;
  o.host = "host-" + std::to_string(rank);
  o.role = "student " + std::to_string(rank);
  o.secret = secret;
  o.heartbeat_s = 0.05;
  o.watchdog_s = 3.0;
  o.connect_timeout_s = 5;
  o.log = log.fn();
  return o;
}

// A trainer loop on its own thread: stop_step at each step boundary, one step per `period`, report.
struct Trainer {
  Agent& agent;
  std::chrono::microseconds period;
  int64_t freeze_at = -1;  // stop reporting progress after this many steps (simulated hang)
  std::atomic<bool> running{true};
  std::atomic<int64_t> step{0};
  std::atomic<bool> finished{false};  // set after stopped_at / error are final: read them only then
  std::optional<int64_t> stopped_at;
  std::string error;
  std::thread thread;

  std::function<void(int64_t)> inside_step;  // runs after stop_step let step s begin (may block)

  Trainer(Agent& a, std::chrono::microseconds p, int64_t freeze = -1,
          std::function<void(int64_t)> inside = nullptr)
      : agent(a), period(p), freeze_at(freeze), inside_step(std::move(inside)) {
    thread = std::thread([this] { run(); });
  }
  ~Trainer() { join(); }
  void join() {
    running = false;
    if (thread.joinable()) thread.join();
  }
  void run() {
    try {
      for (int64_t s = 0; running;) {
        if (freeze_at >= 0 && s >= freeze_at) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          continue;
        }
        const auto stop = agent.stop_step(s);
        if (stop && s == *stop) {
          stopped_at = s;
          finished = true;
          return;
        }
        if (period.count() > 0) std::this_thread::sleep_for(period);
        else std::this_thread::yield();
        if (inside_step) inside_step(s);
        ++s;
        step = s;
        agent.report(s, 0, 1, {{"train_loss", 1.0 / double(s)}});
      }
    } catch (const std::exception& e) {
      error = e.what();
      finished = true;
    }
  }
};

// Captures the abort an agent delivers to its handler.
struct AbortCatcher {
  std::mutex mu;
  std::optional<AbortInfo> info;
  std::function<void(const AbortInfo&)> fn() {
    return [this](const AbortInfo& i) {
      std::lock_guard lock(mu);
      info = i;
    };
  }
  std::optional<AbortInfo> get() {
    std::lock_guard lock(mu);
    return info;
  }
};

// ---- raw sockets (hostile peers) --------------------------------------------------------------

int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void raw_send(int fd, const std::vector<uint8_t>& bytes) {
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

// Reads until the peer closes (EOF or reset): true if that happens within timeout_s.
bool closed_by_peer(int fd, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
  return false;
}

// Reads one frame (bounded by timeout) and decodes it.
std::optional<Message> raw_read_message(int fd, double timeout_s) {
  auto read_exact = [&](uint8_t* dst, size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    size_t got = 0;
    while (got < n && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      const ssize_t r = ::recv(fd, dst + got, n - got, 0);
      if (r <= 0) return false;
      got += size_t(r);
    }
    return got == n;
  };
  std::array<uint8_t, 4> prefix;
  if (!read_exact(prefix.data(), 4)) return std::nullopt;
  const uint32_t n = read_frame_length(prefix, kMaxFrameBytes);
  std::vector<uint8_t> body(n);
  if (!read_exact(body.data(), n)) return std::nullopt;
  return decode(body);
}

std::string http_get(uint16_t port, const std::string& request, double timeout_s = 5) {
  const int fd = raw_connect(port);
  if (fd < 0) return "";
  raw_send(fd, std::vector<uint8_t>(request.begin(), request.end()));
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

// ---- child processes: this test binary re-executed as one agent or a coordinator -----------------

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "";
}

// This test binary, re-executed to run only ControlChild.DISABLED_Main with `vars` set.
class ChildProcess : public test::TestProcess {
 public:
  ChildProcess(const std::map<std::string, std::string>& vars, const std::string& tag)
      : TestProcess({self_exe(), "--gtest_filter=ControlChild.DISABLED_Main", "--gtest_also_run_disabled_tests"},
                    vars, "control_" + tag) {}
};

std::map<std::string, std::string> agent_child_env(int rank, int world, const Endpoint& ep, const Secret& secret,
                                                   int period_ms, int idle_at = -1, bool signals = false) {
  return {{"DEEPEN_CONTROL_CHILD", "agent"},  {"CHILD_RANK", std::to_string(rank)},
          {"CHILD_WORLD", std::to_string(world)}, {"CHILD_ENDPOINT", ep.str()},
          {"DEEPEN_JOB_SECRET", secret_hex(secret)}, {"CHILD_PERIOD_MS", std::to_string(period_ms)},
          {"CHILD_IDLE_AT", std::to_string(idle_at)}, {"CHILD_SIGNALS", signals ? "1" : "0"}};
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// One rank as the trainer would run it under slurm/run.sbatch: rank and world from srun's variables,
// the secret from DEEPEN_JOB_SECRET_FILE, the coordinator's host from DEEPEN_COORDINATOR; rank 0
// hosts through ControlPlane and publishes the endpoint in the run folder (the trainer would
// broadcast it over MPI). Returns the exit code: 3 after the coordinated stop.
int run_rank_child() {
  const int rank = env_int("SLURM_PROCID", 0), world = env_int("SLURM_NTASKS", 1);
  ControlOptions o;
  o.rank = rank;
  o.world = world;
  o.role = rank == 0 ? "teacher p0 s0" : "student " + std::to_string(rank - 1);
  o.secret = *secret_from_env();
  o.heartbeat_s = 0.05;
  o.watchdog_s = 5;
  o.hard_exit_after_s = 2;
  o.coordinator_bind = "127.0.0.1";
  const Endpoint where = *coordinator_from_launch_env(0, "");
  const std::string file = std::string(std::getenv("DEEPEN_RUN_DIR")) + "/control/endpoint";
  ControlPlane plane(o);
  if (rank == 0) {
    Endpoint ep = plane.host_coordinator();
    ep.host = where.host;  // "localhost" from DEEPEN_COORDINATOR, as other nodes would name it
    write_endpoint_file(file, ep);
  }
  plane.connect(wait_for_endpoint_file(file, 20));
  std::printf("CHILD READY rank %d\n", rank);
  std::fflush(stdout);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  try {
    for (int64_t s = 0; std::chrono::steady_clock::now() < limit;) {
      if (const auto stop = plane.stop_step(s); stop && s == *stop) {
        std::printf("CHILD STOP %lld\n", static_cast<long long>(s));
        std::fflush(stdout);
        plane.shutdown(kExitRequeue, "coordinated stop");
        return kExitRequeue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(rank == 0 ? 2 : 8));  // the teacher runs ahead
      ++s;
      plane.report(s, 0, 1, {{"train_loss", 1.0 / double(s)}});
    }
  } catch (const ControlError& e) {
    std::fprintf(stderr, "CHILD ABORTED %s\n", e.what());
    return 1;
  }
  return 0;
}

// The child's body: an agent with a simulated trainer loop, or a coordinator that publishes its
// endpoint in a file. It prints "CHILD ..." lines the parent reads, and exits with _Exit so that
// nothing else runs after the verdict: 3 after a coordinated stop, 1 after an abort.
TEST(ControlChild, DISABLED_Main) {
  const char* mode = std::getenv("DEEPEN_CONTROL_CHILD");
  if (!mode) GTEST_SKIP() << "only run as a child process of the control-plane tests";
  const Secret secret = *secret_from_env();
  const int world = env_int("CHILD_WORLD", 1);
  if (std::string(mode) == "coordinator") {
    LogSink log;
    CoordinatorOptions o = fast_coordinator(world, secret, log);
    o.log = nullptr;
    Coordinator c(o);
    write_endpoint_file(std::getenv("CHILD_ENDPOINT_FILE"), c.endpoint());
    std::printf("CHILD READY\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // the parent kills it
    std::_Exit(0);
  }
  if (std::string(mode) == "rank") {  // one rank of a job launched by slurm/run.sbatch
    std::_Exit(run_rank_child());
  }
  const int rank = env_int("CHILD_RANK", 0);
  LogSink unused;
  AgentOptions o = fast_agent(rank, world, secret, unused);
  o.host = "child-host-" + std::to_string(rank);
  o.log = nullptr;  // stderr: the parent checks the abort message there
  o.handle_signals = env_int("CHILD_SIGNALS", 0) == 1;
  o.hard_exit_after_s = 0.2;
  Agent agent(o);
  agent.connect(parse_endpoint(std::getenv("CHILD_ENDPOINT"), "CHILD_ENDPOINT"));
  std::printf("CHILD READY\n");
  std::fflush(stdout);
  const int period_ms = env_int("CHILD_PERIOD_MS", 5);
  const int idle_at = env_int("CHILD_IDLE_AT", -1);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  try {
    for (int64_t s = 0; std::chrono::steady_clock::now() < limit;) {
      if (idle_at >= 0 && s >= idle_at) {  // "stuck in a collective": heartbeats go on, steps do not
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      const auto stop = agent.stop_step(s);
      if (stop && s == *stop) {
        std::printf("CHILD STOP %lld\n", static_cast<long long>(s));
        std::fflush(stdout);
        agent.shutdown(kExitRequeue, "coordinated stop");
        std::_Exit(kExitRequeue);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
      ++s;
      agent.report(s, 0, 1, {{"train_loss", 1.0 / double(s)}});
    }
  } catch (const ControlError& e) {
    std::fprintf(stderr, "CHILD ABORTED %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::_Exit(0);
}

int64_t step_of(const Coordinator& c, int rank) { return c.ranks()[size_t(rank)].step; }

// ---- tests: basics ----------------------------------------------------------------------------

TEST(ControlPlaneNet, AgentsConnectReportAndLeaveCleanly) {
  const Secret secret = generate_secret();
  LogSink log;
  Coordinator coord(fast_coordinator(2, secret, log));
  Agent a0(fast_agent(0, 2, secret, log)), a1(fast_agent(1, 2, secret, log));
  a0.connect(coord.endpoint());
  a1.connect(coord.endpoint());
  {
    Trainer t0(a0, std::chrono::milliseconds(2)), t1(a1, std::chrono::milliseconds(2));
    ASSERT_TRUE(eventually([&] { return step_of(coord, 0) > 5 && step_of(coord, 1) > 5; }, 10));
  }
  const auto ranks = coord.ranks();
  EXPECT_EQ(ranks[1].host, "host-1");
  EXPECT_EQ(ranks[1].role, "student 1");
  EXPECT_EQ(ranks[1].pid, ::getpid());
  EXPECT_EQ(ranks[1].state, RankState::kConnected);
  a0.shutdown(0);
  a1.shutdown(0);
  EXPECT_TRUE(coord.wait_all_done(5));
  EXPECT_FALSE(coord.aborted().has_value());
  EXPECT_FALSE(a0.aborted().has_value());
}

// ---- tests: hostile peers ---------------------------------------------------------------------

// Two real agents with running trainers; checks after an attack that they were not disturbed:
// still connected, steps still arriving, no abort anywhere.
struct RealJob {
  Secret secret = generate_secret();
  LogSink log;
  std::unique_ptr<Coordinator> coord;
  std::unique_ptr<Agent> a0, a1;
  std::unique_ptr<Trainer> t0, t1;
  explicit RealJob(int world = 2) {
    coord = std::make_unique<Coordinator>(fast_coordinator(world, secret, log));
    a0 = std::make_unique<Agent>(fast_agent(0, world, secret, log));
    a1 = std::make_unique<Agent>(fast_agent(1, world, secret, log));
    a0->connect(coord->endpoint());
    a1->connect(coord->endpoint());
    t0 = std::make_unique<Trainer>(*a0, std::chrono::milliseconds(2));
    t1 = std::make_unique<Trainer>(*a1, std::chrono::milliseconds(2));
  }
  uint16_t port() const { return coord->endpoint().port; }
  void expect_undisturbed() {
    const int64_t s0 = step_of(*coord, 0), s1 = step_of(*coord, 1);
    EXPECT_TRUE(eventually([&] { return step_of(*coord, 0) > s0 + 3 && step_of(*coord, 1) > s1 + 3; }, 10))
        << "real agents' steps stopped arriving";
    EXPECT_FALSE(coord->aborted().has_value()) << coord->aborted()->message;
    EXPECT_FALSE(a0->aborted().has_value());
    EXPECT_FALSE(a1->aborted().has_value());
    EXPECT_FALSE(t0->finished) << t0->error;
    EXPECT_FALSE(t1->finished) << t1->error;
    for (const auto& r : coord->ranks()) {
      if (r.rank < 2) EXPECT_EQ(r.state, RankState::kConnected) << "rank " << r.rank;
    }
  }
  ~RealJob() {
    t0.reset();
    t1.reset();
    a0->shutdown(0);
    a1->shutdown(0);
  }
};

TEST(ControlSecurity, WrongSecretIsRejectedAndClosedWhileRealAgentsKeepReporting) {
  RealJob job;
  // A whole agent with another job's secret: refused, and told why it might be.
  AgentOptions intruder_opt = fast_agent(0, 2, generate_secret(), job.log);
  Agent intruder(intruder_opt);
  try {
    intruder.connect(job.coord->endpoint());
    ADD_FAILURE() << "an agent with the wrong secret was accepted";
  } catch (const ControlError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong job secret"), std::string::npos) << e.what();
  }
  // By hand: a well-formed Auth with a forged MAC gets the connection closed.
  const int fd = raw_connect(job.port());
  ASSERT_GE(fd, 0);
  const auto challenge = raw_read_message(fd, 5);
  ASSERT_TRUE(challenge && std::holds_alternative<Challenge>(*challenge));
  Auth forged{1, 2, 1, "evil", "", random_nonce(), {}};
  forged.mac = agent_mac(generate_secret(), std::get<Challenge>(*challenge).nonce, forged);
  raw_send(fd, encode_frame(forged));
  EXPECT_TRUE(closed_by_peer(fd, 5));
  ::close(fd);
  EXPECT_GE(job.coord->stats().rejected_auth, 2u);
  EXPECT_TRUE(job.log.contains("wrong job secret"));
  job.expect_undisturbed();
}

TEST(ControlSecurity, OversizedLengthPrefixClosesTheConnection) {
  RealJob job;
  for (const std::vector<uint8_t>& prefix :
       {std::vector<uint8_t>{0xff, 0xff, 0xff, 0xff}, std::vector<uint8_t>{0x00, 0x01, 0x00, 0x01},
        std::vector<uint8_t>{0x00, 0x00, 0x08, 0x00}, std::vector<uint8_t>{0, 0, 0, 0}}) {
    const int fd = raw_connect(job.port());
    ASSERT_GE(fd, 0);
    raw_send(fd, prefix);
    EXPECT_TRUE(closed_by_peer(fd, 5)) << "prefix " << int(prefix[0]) << "," << int(prefix[1]) << ","
                                       << int(prefix[2]) << "," << int(prefix[3]);
    ::close(fd);
  }
  EXPECT_GE(job.coord->stats().protocol_errors, 4u);
  job.expect_undisturbed();
}

TEST(ControlSecurity, GarbageBytesCloseTheConnection) {
  RealJob job;
  std::mt19937 rng(12345);
  for (int i = 0; i < 40; ++i) {
    const int fd = raw_connect(job.port());
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> junk(1 + rng() % 300);
    for (auto& b : junk) b = uint8_t(rng());
    if (i % 2) {  // a plausible small length, then junk: exercises the body parser, not just the prefix
      junk[0] = 0; junk[1] = 0; junk[2] = 0; junk[3] = uint8_t(std::min<size_t>(junk.size() - 4, 200));
    }
    raw_send(fd, junk);
    EXPECT_TRUE(closed_by_peer(fd, 5)) << "garbage connection " << i << " was not closed";
    ::close(fd);
  }
  job.expect_undisturbed();
}

TEST(ControlSecurity, HalfOpenConnectionsAreDroppedAfterTheDeadlineWithoutBlockingOthers) {
  RealJob job(3);
  std::vector<int> fds;
  for (int i = 0; i < 20; ++i) fds.push_back(raw_connect(job.port()));  // connect, send nothing
  // A real rank joining while 20 silent connections are pending is served at once.
  Agent late(fast_agent(2, 3, job.secret, job.log));
  late.connect(job.coord->endpoint());
  for (int fd : fds) {
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(closed_by_peer(fd, 5)) << "half-open connection still open after the auth deadline";
    ::close(fd);
  }
  EXPECT_GE(job.coord->stats().timed_out, 20u);
  job.expect_undisturbed();
  late.shutdown(0);
}

TEST(ControlSecurity, ThousandRapidConnectsLeaveRealAgentsStepsArrivingUnchanged) {
  RealJob job;
  std::atomic<bool> flooding{true};
  std::atomic<int> regressions{0}, mismatches{0};
  std::atomic<double> worst_age{0};
  // Watches the coordinator's view throughout: per rank the step never goes back, the loss that came
  // with it is the one the trainer reported for that step (1/step), heartbeats stay fresh.
  std::thread watcher([&] {
    int64_t last[2] = {-1, -1};
    while (flooding) {
      for (const auto& r : job.coord->ranks()) {
        if (r.rank > 1) continue;
        if (r.step < last[r.rank]) ++regressions;
        last[r.rank] = r.step;
        if (r.step > 0 && (r.metrics.empty() || r.metrics[0].second != 1.0 / double(r.step))) ++mismatches;
        if (r.heartbeat_age_s > worst_age) worst_age = r.heartbeat_age_s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  int connected = 0;
  for (int i = 0; i < 1000; ++i) {
    const int fd = raw_connect(job.port());
    if (fd < 0) continue;
    ++connected;
    if (i % 3 == 0) raw_send(fd, {0x42});
    ::close(fd);
  }
  flooding = false;
  watcher.join();
  EXPECT_EQ(connected, 1000);
  EXPECT_EQ(regressions, 0);
  EXPECT_EQ(mismatches, 0);
  EXPECT_LT(worst_age, 2.0) << "a real agent's heartbeat went stale during the flood";
  // The kernel completes connects before the coordinator accepts them; the backlog drains soon.
  EXPECT_TRUE(eventually([&] { return job.coord->stats().accepted >= 1000u; }, 10))
      << job.coord->stats().accepted << " accepted";
  // The steps the trainers report now still reach the coordinator.
  const int64_t now0 = job.t0->step;
  EXPECT_TRUE(eventually([&] { return step_of(*job.coord, 0) >= now0; }, 5));
  job.expect_undisturbed();
}

// ---- tests: watchdog --------------------------------------------------------------------------

TEST(ControlWatchdog, KilledAgentProcessAbortsEveryOtherRankNamingRankHostAndLastStep) {
  const Secret secret = generate_secret();
  LogSink log;
  Coordinator coord(fast_coordinator(3, secret, log));
  AbortCatcher c0, c1;
  AgentOptions o0 = fast_agent(0, 3, secret, log), o1 = fast_agent(1, 3, secret, log);
  o0.on_abort = c0.fn();
  o1.on_abort = c1.fn();
  Agent a0(o0), a1(o1);
  a0.connect(coord.endpoint());
  a1.connect(coord.endpoint());
  Trainer t0(a0, std::chrono::milliseconds(2)), t1(a1, std::chrono::milliseconds(2));
  ChildProcess child(agent_child_env(2, 3, coord.endpoint(), secret, 2, /*idle_at=*/5), "kill9");
  ASSERT_TRUE(eventually([&] { return step_of(coord, 2) == 5; }, 15)) << child.err();
  child.signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return c0.get() && c1.get(); }, 10)) << "the other ranks were not aborted";
  for (auto* c : {&c0, &c1}) {
    const AbortInfo info = *c->get();
    EXPECT_EQ(info.rank, 2);
    EXPECT_EQ(info.host, "child-host-2");
    EXPECT_EQ(info.step, 5);
    EXPECT_NE(info.message.find("rank 2 on child-host-2"), std::string::npos) << info.message;
    EXPECT_NE(info.message.find("last step 5"), std::string::npos) << info.message;
    EXPECT_NE(info.message.find("connection lost"), std::string::npos) << info.message;
  }
  // The trainers, blocked or not, learn it at their next step boundary instead of hanging.
  ASSERT_TRUE(eventually([&] { return t0.finished && t1.finished; }, 5));
  EXPECT_NE(t0.error.find("rank 2 on child-host-2"), std::string::npos) << t0.error;
  EXPECT_EQ(child.wait_exit(5), 128 + SIGKILL);
}

TEST(ControlWatchdog, FrozenProcessAbortsTheJobAndOtherProcessesExitNonZeroWithTheMessage) {
  const Secret secret = generate_secret();
  LogSink log;
  CoordinatorOptions co = fast_coordinator(3, secret, log);
  co.watchdog_s = 1.0;
  Coordinator coord(co);
  AbortCatcher c0;
  AgentOptions o0 = fast_agent(0, 3, secret, log);
  o0.on_abort = c0.fn();
  Agent a0(o0);
  a0.connect(coord.endpoint());
  Trainer t0(a0, std::chrono::milliseconds(2));
  ChildProcess frozen(agent_child_env(1, 3, coord.endpoint(), secret, 2), "frozen");
  ChildProcess other(agent_child_env(2, 3, coord.endpoint(), secret, 2), "other");
  ASSERT_TRUE(eventually([&] { return step_of(coord, 1) > 3 && step_of(coord, 2) > 3; }, 15))
      << frozen.err() << other.err();
  frozen.signal(SIGSTOP);  // alive, connection up, but not a single heartbeat more
  const auto code = other.wait_exit(15);
  ASSERT_TRUE(code.has_value()) << "the other process did not exit after the abort";
  EXPECT_EQ(*code, 1);
  const std::string err = other.err();
  EXPECT_NE(err.find("ABORT: rank 1 on child-host-1"), std::string::npos) << err;
  EXPECT_NE(err.find("no heartbeat for"), std::string::npos) << err;
  ASSERT_TRUE(eventually([&] { return c0.get().has_value(); }, 5));
  EXPECT_EQ(c0.get()->rank, 1);
  frozen.signal(SIGKILL);
  EXPECT_TRUE(frozen.wait_exit(5).has_value());
}

TEST(ControlWatchdog, JobWideStallAbortsNamingTheRankThatStoppedFirst) {
  const Secret secret = generate_secret();
  LogSink log;
  CoordinatorOptions co = fast_coordinator(2, secret, log);
  co.watchdog_s = 1.0;
  Coordinator coord(co);
  AbortCatcher c0;
  AgentOptions o0 = fast_agent(0, 2, secret, log), o1 = fast_agent(1, 2, secret, log);
  o0.on_abort = c0.fn();
  Agent a0(o0), a1(o1);
  a0.connect(coord.endpoint());
  a1.connect(coord.endpoint());
  // Rank 1 hangs after 5 steps; rank 0 goes on a little (its steps keep the job "alive"), then
  // blocks on rank 1 as a collective would.
  Trainer t1(a1, std::chrono::milliseconds(2), /*freeze=*/5);
  ASSERT_TRUE(eventually([&] { return step_of(coord, 1) == 5; }, 10));
  {
    Trainer t0(a0, std::chrono::milliseconds(20), /*freeze=*/15);
    ASSERT_TRUE(eventually([&] { return c0.get().has_value(); }, 15));
  }
  const AbortInfo info = *c0.get();
  EXPECT_EQ(info.rank, 1) << info.message;
  EXPECT_EQ(info.step, 5);
  EXPECT_NE(info.message.find("no rank has made progress"), std::string::npos) << info.message;
}

TEST(ControlWatchdog, LosingTheCoordinatorAbortsEveryAgent) {
  const Secret secret = generate_secret();
  const auto dir = std::filesystem::temp_directory_path() / ("deepen_coord_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "endpoint").string();
  std::filesystem::remove(file);
  ChildProcess coordinator({{"DEEPEN_CONTROL_CHILD", "coordinator"}, {"CHILD_WORLD", "2"},
                            {"DEEPEN_JOB_SECRET", secret_hex(secret)}, {"CHILD_ENDPOINT_FILE", file}},
                           "coordinator");
  const Endpoint ep = wait_for_endpoint_file(file, 15);
  LogSink log;
  AbortCatcher c0, c1;
  AgentOptions o0 = fast_agent(0, 2, secret, log), o1 = fast_agent(1, 2, secret, log);
  o0.on_abort = c0.fn();
  o1.on_abort = c1.fn();
  Agent a0(o0), a1(o1);
  a0.connect(ep);
  a1.connect(ep);
  Trainer t0(a0, std::chrono::milliseconds(2)), t1(a1, std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few pings carry rank 0's state
  coordinator.signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return c0.get() && c1.get(); }, 10));
  EXPECT_NE(c1.get()->message.find("lost the control connection to the coordinator at " + ep.str()),
            std::string::npos) << c1.get()->message;
  EXPECT_EQ(c1.get()->rank, 0) << "the hosting rank named in the coordinator's pings";
  EXPECT_NE(c1.get()->message.find("rank 0 on host-0"), std::string::npos) << c1.get()->message;
  std::filesystem::remove_all(dir);
}

TEST(ControlWatchdog, FrozenCoordinatorMakesAgentsAbortAfterTheWatchdogTimeout) {
  const Secret secret = generate_secret();
  const auto dir = std::filesystem::temp_directory_path() / ("deepen_coordstop_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "endpoint").string();
  std::filesystem::remove(file);
  ChildProcess coordinator({{"DEEPEN_CONTROL_CHILD", "coordinator"}, {"CHILD_WORLD", "1"},
                            {"DEEPEN_JOB_SECRET", secret_hex(secret)}, {"CHILD_ENDPOINT_FILE", file}},
                           "frozen_coordinator");
  const Endpoint ep = wait_for_endpoint_file(file, 15);
  LogSink log;
  AbortCatcher c0;
  AgentOptions o0 = fast_agent(0, 1, secret, log);
  o0.on_abort = c0.fn();
  o0.watchdog_s = 1.0;
  Agent a0(o0);
  a0.connect(ep);
  coordinator.signal(SIGSTOP);  // its socket stays open: only the silence tells
  ASSERT_TRUE(eventually([&] { return c0.get().has_value(); }, 10));
  EXPECT_NE(c0.get()->message.find("silent for"), std::string::npos) << c0.get()->message;
  coordinator.signal(SIGKILL);
  std::filesystem::remove_all(dir);
}

// A rank whose trainer throws leaves without shutdown(): the Agent's destructor drops the
// connection, and the others abort at once instead of waiting in a collective for it.
TEST(ControlWatchdog, AgentDestroyedWithoutShutdownAbortsTheOthers) {
  const Secret secret = generate_secret();
  LogSink log;
  Coordinator coord(fast_coordinator(2, secret, log));
  AbortCatcher c0;
  AgentOptions o0 = fast_agent(0, 2, secret, log);
  o0.on_abort = c0.fn();
  Agent a0(o0);
  a0.connect(coord.endpoint());
  {
    Agent a1(fast_agent(1, 2, secret, log));
    a1.connect(coord.endpoint());
    a1.report(4, 0, 1);
    ASSERT_TRUE(eventually([&] { return step_of(coord, 1) == 4; }, 10));
  }
  ASSERT_TRUE(eventually([&] { return c0.get().has_value(); }, 10));
  EXPECT_EQ(c0.get()->rank, 1);
  EXPECT_EQ(c0.get()->step, 4);
  EXPECT_NE(c0.get()->message.find("control connection lost"), std::string::npos) << c0.get()->message;
}

TEST(ControlWatchdog, RankLeavingWithAnErrorAbortsTheOthersWithItsMessage) {
  const Secret secret = generate_secret();
  LogSink log;
  Coordinator coord(fast_coordinator(2, secret, log));
  AbortCatcher c0;
  AgentOptions o0 = fast_agent(0, 2, secret, log);
  o0.on_abort = c0.fn();
  Agent a0(o0), a1(fast_agent(1, 2, secret, log));
  a0.connect(coord.endpoint());
  a1.connect(coord.endpoint());
  a1.report(7, 0, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  a1.shutdown(1, "CUDA error: out of memory");
  ASSERT_TRUE(eventually([&] { return c0.get().has_value(); }, 10));
  EXPECT_EQ(c0.get()->message, "rank 1 on host-1 (student 1, pid " + std::to_string(::getpid()) +
                                   "), last step 7: exited with code 1: CUDA error: out of memory");
}

TEST(ControlWatchdog, RankThatNeverConnectsAbortsAfterTheConnectTimeout) {
  const Secret secret = generate_secret();
  LogSink log;
  CoordinatorOptions co = fast_coordinator(3, secret, log);
  co.connect_timeout_s = 0.5;
  Coordinator coord(co);
  AbortCatcher c0;
  AgentOptions o0 = fast_agent(0, 3, secret, log);
  o0.on_abort = c0.fn();
  Agent a0(o0), a1(fast_agent(1, 3, secret, log));
  a0.connect(coord.endpoint());
  a1.connect(coord.endpoint());
  ASSERT_TRUE(eventually([&] { return c0.get().has_value(); }, 10));
  EXPECT_EQ(c0.get()->rank, 2);
  EXPECT_NE(c0.get()->message.find("rank 2 never connected"), std::string::npos) << c0.get()->message;
}

// ---- tests: coordinated stop ------------------------------------------------------------------

void signal_stops_all_processes_at_one_step(int sig, int signalled_rank) {
  const Secret secret = generate_secret();
  LogSink log;
  Coordinator coord(fast_coordinator(3, secret, log));
  // Rank 0 runs five times faster than ranks 1 and 2, as a teacher ahead of its students would.
  std::vector<std::unique_ptr<ChildProcess>> children;
  const int period_ms[3] = {2, 10, 10};
  for (int r = 0; r < 3; ++r) {
    children.push_back(std::make_unique<ChildProcess>(
        agent_child_env(r, 3, coord.endpoint(), secret, period_ms[r], -1, /*signals=*/true),
        "stop" + std::to_string(sig) + "_" + std::to_string(r)));
  }
  ASSERT_TRUE(eventually([&] {
    for (int r = 0; r < 3; ++r) {
      if (step_of(coord, r) < 5 || children[size_t(r)]->out().find("CHILD READY") == std::string::npos) return false;
    }
    return true;
  }, 15));
  int64_t max_seen = 0;
  for (const auto& r : coord.ranks()) max_seen = std::max(max_seen, r.step);
  children[size_t(signalled_rank)]->signal(sig);
  std::set<std::string> stops;
  for (int r = 0; r < 3; ++r) {
    const auto code = children[size_t(r)]->wait_exit(15);
    ASSERT_TRUE(code.has_value()) << "rank " << r << " did not stop";
    EXPECT_EQ(*code, kExitRequeue) << "rank " << r << ": " << children[size_t(r)]->err();
    const std::string out = children[size_t(r)]->out();
    const size_t at = out.find("CHILD STOP ");
    ASSERT_NE(at, std::string::npos) << out;
    stops.insert(out.substr(at + 11, out.find('\n', at) - at - 11));
  }
  ASSERT_EQ(stops.size(), 1u) << "ranks stopped at different steps";
  const int64_t s = std::stoll(*stops.begin());
  EXPECT_EQ(coord.stop_step(), s);
  EXPECT_GE(s, max_seen) << "the stop step is behind a rank's step at the time of the signal";
  EXPECT_TRUE(coord.wait_all_done(5));
  for (const auto& r : coord.ranks()) {
    EXPECT_EQ(r.exit_code, kExitRequeue);
    EXPECT_EQ(r.step, s) << "rank " << r.rank << " reported a step other than the stop step";
  }
  EXPECT_FALSE(coord.aborted().has_value());
}

TEST(ControlStop, Sigusr1OnOneProcessStopsEveryProcessAtTheSameStepWithTheRequeueCode) {
  signal_stops_all_processes_at_one_step(SIGUSR1, 1);
}

TEST(ControlStop, SigtermOnTheFastestProcessStopsEveryProcessAtTheSameStep) {
  signal_stops_all_processes_at_one_step(SIGTERM, 0);
}

// Ranks stepping as fast as they can at different speeds, coupled as in the real job: a rank cannot
// finish step s while the slowest has completed fewer than s - 3 (a teacher's bounded in-flight
// buffer, a student waiting for logits). A stop requested at a random moment by a random rank:
// every rank must stop at the same step, none may have begun a step beyond it (stop_step would
// throw logic_error), the step is at least where the fastest rank was, and nothing deadlocks.
TEST(ControlStop, RanksRacingAtFullSpeedAllAgreeAndNoneOvershoots) {
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 5; ++round) {
    std::array<std::atomic<int64_t>, 4> completed{};
    std::atomic<bool> round_running{true};
    auto coupled = [&](int rank) {
      return [&, rank](int64_t s) {
        auto slowest = [&] {
          int64_t m = completed[0];
          for (auto& c : completed) m = std::min<int64_t>(m, c);
          return m;
        };
        while (round_running && s - slowest() >= 3) std::this_thread::yield();
        completed[size_t(rank)] = s + 1;
      };
    };
    const Secret secret = generate_secret();
    LogSink log;
    Coordinator coord(fast_coordinator(4, secret, log));
    std::vector<std::unique_ptr<Agent>> agents;
    for (int r = 0; r < 4; ++r) {
      agents.push_back(std::make_unique<Agent>(fast_agent(r, 4, secret, log)));
      agents.back()->connect(coord.endpoint());
    }
    std::vector<std::unique_ptr<Trainer>> trainers;
    const int period_us[4] = {0, 0, 100, 300};
    for (int r = 0; r < 4; ++r) {
      trainers.push_back(std::make_unique<Trainer>(*agents[size_t(r)], std::chrono::microseconds(period_us[r]),
                                                   -1, coupled(r)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 100));
    const int64_t fastest_before = trainers[0]->step;
    agents[rng() % 4]->request_stop("test round " + std::to_string(round));
    for (size_t r = 0; r < trainers.size(); ++r) {
      auto& t = trainers[r];
      ASSERT_TRUE(eventually([&] { return t->finished.load(); }, 20))
          << "round " << round << " rank " << r << " at step " << t->step << " never stopped; log:\n"
          << [&] {
               std::lock_guard lock(log.mu);
               std::string all;
               for (const auto& l : log.lines) all += l + "\n";
               return all;
             }();
      t->join();
    }
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(trainers[size_t(r)]->error.empty()) << "rank " << r << ": " << trainers[size_t(r)]->error;
      EXPECT_EQ(trainers[size_t(r)]->stopped_at, coord.stop_step()) << "round " << round << " rank " << r;
    }
    EXPECT_GE(*coord.stop_step(), fastest_before);
    round_running = false;
    for (auto& a : agents) a->shutdown(kExitRequeue);
  }
}

TEST(ControlStop, StopBeforeAnyStepStopsEveryRankAtItsFirstStep) {
  const Secret secret = generate_secret();
  LogSink log;
  Coordinator coord(fast_coordinator(2, secret, log));
  Agent a0(fast_agent(0, 2, secret, log)), a1(fast_agent(1, 2, secret, log));
  a0.connect(coord.endpoint());
  a1.connect(coord.endpoint());
  a1.request_stop("early");
  ASSERT_TRUE(eventually([&] { return a0.decided_stop_step() && a1.decided_stop_step(); }, 10));
  EXPECT_EQ(coord.stop_step(), kStopAtFirstStep);
  EXPECT_EQ(a0.stop_step(40), 40) << "both resume from checkpoint step 40 and stop there";
  EXPECT_EQ(a1.stop_step(40), 40);
}

// ---- tests: /metrics --------------------------------------------------------------------------

TEST(ControlMetricsHttp, ScrapeReturnsValidPrometheusTextWhoseStepIncreases) {
  const Secret secret = generate_secret();
  LogSink log;
  CoordinatorOptions co = fast_coordinator(2, secret, log);
  co.metrics = true;
  Coordinator coord(co);
  ASSERT_TRUE(coord.metrics_endpoint().has_value());
  EXPECT_EQ(coord.metrics_endpoint()->host, "127.0.0.1");
  const uint16_t port = coord.metrics_endpoint()->port;
  Agent a0(fast_agent(0, 2, secret, log)), a1(fast_agent(1, 2, secret, log));
  a0.connect(coord.endpoint());
  a1.connect(coord.endpoint());
  Trainer t0(a0, std::chrono::milliseconds(5)), t1(a1, std::chrono::milliseconds(5));
  ASSERT_TRUE(eventually([&] { return step_of(coord, 0) > 2; }, 10));
  auto scrape = [&](std::vector<test::PromSample>& samples) {
    const std::string response = http_get(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
    EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
    const std::string body = response.substr(response.find("\r\n\r\n") + 4);
    EXPECT_EQ(test::parse_prometheus(body, samples), "") << body;
    return body;
  };
  std::vector<test::PromSample> first, second;
  const std::string body = scrape(first);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  scrape(second);
  const double step_before = test::prom_value(first, "deepen_step", "0");
  const double step_after = test::prom_value(second, "deepen_step", "0");
  EXPECT_GT(step_before, 0);
  EXPECT_GT(step_after, step_before);
  EXPECT_EQ(test::prom_value(second, "deepen_world_size"), 2);
  EXPECT_EQ(test::prom_value(second, "deepen_ranks_connected"), 2);
  EXPECT_LT(test::prom_value(second, "deepen_heartbeat_age_seconds", "1"), 3.0);
  EXPECT_GT(test::prom_value(second, "deepen_train_loss", "1"), 0);
  for (const char* family : {"deepen_step", "deepen_stage", "deepen_active_depth", "deepen_heartbeat_age_seconds",
                             "deepen_train_loss"}) {
    EXPECT_NE(body.find(std::string("# HELP ") + family + " "), std::string::npos) << family;
    EXPECT_NE(body.find(std::string("# TYPE ") + family + " gauge"), std::string::npos) << family;
  }
}

TEST(ControlMetricsHttp, OtherPathsMethodsAndBadRequestsAreRefusedWithinBounds) {
  const Secret secret = generate_secret();
  LogSink log;
  CoordinatorOptions co = fast_coordinator(1, secret, log);
  co.metrics = true;
  co.http_timeout_s = 0.3;
  Coordinator coord(co);
  const uint16_t port = coord.metrics_endpoint()->port;
  EXPECT_EQ(http_get(port, "GET /other HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  const std::string post = http_get(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET"), std::string::npos);
  EXPECT_EQ(http_get(port, "DELETE /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(http_get(port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(http_get(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n";
  EXPECT_EQ(http_get(port, huge).rfind("HTTP/1.1 431", 0), 0u);
  // A client that connects and says nothing is closed after http_timeout_s, others still served.
  const int silent = raw_connect(port);
  ASSERT_GE(silent, 0);
  EXPECT_EQ(http_get(port, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_TRUE(closed_by_peer(silent, 5));
  ::close(silent);
}

// ---- tests: the whole chain ------------------------------------------------------------------

// slurm/run.sbatch (not a dry run) with a fake srun that starts 3 ranks of this binary on this
// machine: Slurm's SIGUSR1 to the batch shell -> forwarded to srun -> to every rank -> coordinated
// stop at one step -> every rank exits 3 -> srun exits 3 -> the script runs `scontrol requeue`.
TEST(ControlEndToEnd, Sigusr1ToTheBatchScriptStopsEveryRankAtOneStepAndRequeues) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("deepen_e2e_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "bin");
  auto write_exe = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir / "bin" / name) << "#!/usr/bin/env bash\n" << body << "\n";
    fs::permissions(dir / "bin" / name, fs::perms::owner_all);
  };
  write_exe("srun",  // starts SLURM_NTASKS ranks here, forwards signals, exits with the highest code
            "while [[ $1 == --* ]]; do shift; done  # srun's own options\n"
            "pids=()\nfor ((r = 0; r < SLURM_NTASKS; r++)); do SLURM_PROCID=$r \"$@\" & pids+=($!); done\n"
            "trap 'kill -USR1 \"${pids[@]}\" 2>/dev/null' USR1\ntrap 'kill -TERM \"${pids[@]}\" 2>/dev/null' TERM\n"
            "rc=0\nfor p in \"${pids[@]}\"; do\n  while :; do wait \"$p\"; kill -0 \"$p\" 2>/dev/null || break; done\n"
            "  wait \"$p\" 2>/dev/null; c=$?; ((c > rc)) && rc=$c\ndone\nexit $rc");
  write_exe("scontrol", "if [[ $1 == show ]]; then echo \"$3\"; exit; fi\necho \"$@\" >> " +
                           (dir / "scontrol.log").string());  // `show hostnames localhost` -> localhost
  write_exe("deepen", "exec " + self_exe() + " --gtest_filter=ControlChild.DISABLED_Main --gtest_also_run_disabled_tests");
  std::ofstream(dir / "run.toml") << "[run]\nout_dir = \"" << (dir / "run").string()
                                  << "\"\n[parallel]\nteacher_pipelines = 1\nteacher_stages = 1\nstudents = 2\n";
  test::TestProcess job({"bash", std::string(test::kSourceDir) + "/slurm/run.sbatch", (dir / "run.toml").string()},
                        {{"SLURM_JOB_NODELIST", "localhost"}, {"SLURM_NTASKS", "3"}, {"SLURM_TASKS_PER_NODE", "3"},
                         {"SLURM_JOB_ID", "77"}, {"SLURM_RESTART_COUNT", ""}, {"DEEPEN_DRY_RUN", ""},
                         {"DEEPEN_HOME", ""}, {"DEEPEN_RUN_DIR", ""}, {"DEEPEN_COORDINATOR", ""},
                         {"DEEPEN_JOB_SECRET", ""}, {"DEEPEN_JOB_SECRET_FILE", ""}, {"DEEPEN_LAUNCHER", ""},
                         {"DEEPEN_BIN", (dir / "bin" / "deepen").string()}, {"DEEPEN_CONTROL_CHILD", "rank"},
                         {"PATH", (dir / "bin").string() + ":" + std::getenv("PATH")}},
                        "e2e");
  auto count = [](const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  ASSERT_TRUE(eventually([&] { return count(job.out(), "CHILD READY") == 3 || job.wait_exit(0); }, 30) &&
              !job.wait_exit(0))
      << job.out() << job.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the ranks take some steps
  job.signal(SIGUSR1);
  const auto code = job.wait_exit(30);
  ASSERT_TRUE(code.has_value()) << job.err();
  EXPECT_EQ(*code, kExitRequeue) << job.err();
  const std::string out = job.out();
  std::set<std::string> stops;
  for (size_t at = out.find("CHILD STOP "); at != std::string::npos; at = out.find("CHILD STOP ", at + 1)) {
    stops.insert(out.substr(at + 11, out.find('\n', at) - at - 11));
  }
  EXPECT_EQ(count(out, "CHILD STOP "), 3u) << out;
  ASSERT_EQ(stops.size(), 1u) << "ranks stopped at different steps:\n" << out;
  EXPECT_GT(std::stoll(*stops.begin()), 0);
  EXPECT_EQ(test::TestProcess::slurp((dir / "scontrol.log").string()), "requeue 77\n") << job.err();
  EXPECT_EQ(job.err().find("ABORT"), std::string::npos) << job.err();
  fs::remove_all(dir);
}

// ---- tests: the ControlPlane facade -----------------------------------------------------------

TEST(ControlPlaneFacade, HostConnectReportStopAndRequeueExitWithoutAbort) {
  ControlConfig cfg;
  cfg.heartbeat_s = 0.05;
  cfg.watchdog_s = 2;
  cfg.metrics_port = 0;
  const Secret secret = generate_secret();
  ControlOptions o0 = control_options(cfg, 0, 2, secret), o1 = control_options(cfg, 1, 2, secret);
  for (auto* o : {&o0, &o1}) {
    o->coordinator_bind = "127.0.0.1";
    o->handle_signals = false;
    o->hard_exit_after_s = -1;
  }
  o0.metrics = true;  // metrics_port 0 in the config means off; tests ask for a free port directly
  ControlPlane p0(o0), p1(o1);
  const Endpoint ep = p0.host_coordinator();
  EXPECT_EQ(ep.host, "127.0.0.1");
  EXPECT_NE(ep.port, 0);
  ASSERT_TRUE(p0.metrics_endpoint().has_value());
  p0.connect(ep);
  p1.connect(ep);
  p0.report(3, 0, 1, {{"train_loss", 2.0}});
  p1.report(3, 0, 1, {{"train_loss", 2.0}});
  EXPECT_EQ(p0.stop_step(3), std::nullopt);
  EXPECT_EQ(p1.stop_step(3), std::nullopt);
  p1.request_stop("test");
  ASSERT_TRUE(eventually([&] { return p0.coordinator()->stop_step().has_value(); }, 10));
  EXPECT_EQ(p0.stop_step(4), 4) << "both had begun step 3, so they stop once 4 are complete";
  EXPECT_EQ(p1.stop_step(4), 4);
  p1.shutdown(kExitRequeue);
  p0.shutdown(kExitRequeue);
  EXPECT_FALSE(p0.aborted().has_value());
  EXPECT_FALSE(p1.aborted().has_value());
}

}  // namespace
}  // namespace deepen::control
