// The control plane at scale, simulated on loopback: one coordinator (this process) and 1,024 or
// 4,096 real Agents (threads in child processes), as a 512-GPU study or a large job would have.
// Measures, per world size: the time for every rank to connect and authenticate (and how often the
// coordinator turned a rank away as busy), the coordinator's CPU per heartbeat and its memory per
// rank, heartbeat freshness (the age of each rank's last frame as the coordinator sees it), the
// coordinated stop's round trip (one rank asks; every rank knows the agreed step), and the time from
// one rank's death (its process killed) to the last rank's abort.
//
//   build/control_scale_bench                       # 1,024 and 4,096 ranks, heartbeat 1 s
//   build/control_scale_bench --ranks 256 --seconds 5 --procs 4
//
// What is real: the coordinator, every Agent, their TCP connections, handshakes and frame MACs.
// What is not: the network (loopback), the trainer (agents report a step and nothing else), and the
// machine (all agents share its cores with the coordinator: the coordinator's figures are upper bounds).
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <span>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "dist/control/agent.h"
#include "dist/control/coordinator.h"
#include "dist/control/hmac.h"
#include "dist/control/wire.h"
#include "dist/control/secret.h"

extern char** environ;

namespace deepen::control {
namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for every process here

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double rss_mib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

double cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

AgentOptions agent_options(int rank, int world, const Secret& secret, double heartbeat_s) {
  AgentOptions o;
  o.rank = rank;
  o.world = world;
  o.host = "sim";
  o.role = "student " + std::to_string(rank);
  o.secret = secret;
  o.heartbeat_s = heartbeat_s;
  o.watchdog_s = 600;          // no rank is ever silent that long here
  o.connect_timeout_s = 300;   // thousands connect at once: busy turnaways are retried
  o.log = [](const std::string&) {};
  return o;
}

// A child: agents for ranks [lo, hi). Prints "ready", then "stop T" once every agent knows the stop
// step and "abort T" once every agent has aborted (T: the last one's time), then exits.
int run_child(int lo, int hi, int world, uint16_t port, const std::string& secret_hex, double heartbeat_s) {
  const Secret secret = parse_secret_hex(secret_hex, "--secret");
  std::vector<std::unique_ptr<Agent>> agents;
  std::vector<std::atomic<double>> aborted_at(size_t(hi - lo));
  for (auto& a : aborted_at) a = 0;
  for (int r = lo; r < hi; ++r) {
    AgentOptions o = agent_options(r, world, secret, heartbeat_s);
    o.on_abort = [&aborted_at, i = r - lo](const AbortInfo&) { aborted_at[size_t(i)] = now_s(); };
    agents.push_back(std::make_unique<Agent>(o));
  }
  // Connect from several threads at once, as ranks starting on many nodes do.
  std::vector<std::thread> connecting;
  std::atomic<size_t> next{0};
  std::atomic<int> failed{0};
  for (int t = 0; t < 16; ++t)
    connecting.emplace_back([&] {
      for (size_t i; (i = next++) < agents.size();) {
        try {
          agents[i]->connect(Endpoint{"127.0.0.1", port});
          agents[i]->report(1, 0, 1, {{"train_loss", 1.0}});
        } catch (const std::exception& e) {
          std::cerr << "child: " << e.what() << "\n";
          ++failed;
        }
      }
    });
  for (auto& t : connecting) t.join();
  if (failed) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  bool stop_said = false;
  while (true) {
    if (!stop_said && std::all_of(agents.begin(), agents.end(), [](auto& a) { return a->decided_stop_step().has_value(); })) {
      std::printf("stop %.6f\n", now_s());
      std::fflush(stdout);
      stop_said = true;
    }
    if (std::all_of(aborted_at.begin(), aborted_at.end(), [](auto& t) { return t > 0; })) {
      double last = 0;
      for (auto& t : aborted_at) last = std::max(last, t.load());
      std::printf("abort %.6f\n", last);
      std::fflush(stdout);
      std::_Exit(0);  // the agents' io threads would wait for nothing
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  std::string line() {
    char buf[256];
    if (!std::fgets(buf, sizeof buf, out)) return "";
    return buf;
  }
};

Child spawn_child(const std::string& self, int lo, int hi, int world, uint16_t port, const std::string& secret,
                  double heartbeat_s) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  const std::vector<std::string> args = {self, "--child", "--lo", std::to_string(lo), "--hi", std::to_string(hi),
                                         "--world", std::to_string(world), "--port", std::to_string(port),
                                         "--secret", secret, "--heartbeat", std::to_string(heartbeat_s)};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child c;
  if (posix_spawn(&c.pid, self.c_str(), &fa, nullptr, argv.data(), environ) != 0)
    throw std::runtime_error("posix_spawn failed");
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  c.out = fdopen(fds[0], "r");
  return c;
}

// The frame MAC's cost on the heartbeat path: one heartbeat as an agent sends it (a step, a phase,
// 12 trainer metrics), framed and decoded with and without its HMAC-SHA256, best of 5 rounds each.
void frame_mac_cost() {
  Heartbeat hb;
  hb.step = 12345;
  hb.phase = "train";
  for (int i = 0; i < 12; ++i) hb.metrics.emplace_back("step_part_" + std::to_string(i) + "_seconds", 0.125 * i);
  const HmacKey key(generate_secret());
  const std::array<uint8_t, 8> seq{};
  const int n = 20000;
  auto best = [&](auto&& body) {
    double b = 1e9;
    for (int round = 0; round < 5; ++round) {
      const double t0 = now_s();
      for (int i = 0; i < n; ++i) body();
      b = std::min(b, (now_s() - t0) / n);
    }
    return b;
  };
  size_t sink = 0;
  const std::vector<uint8_t> frame = encode_frame(hb);
  const std::span<const uint8_t> body(frame.data() + 4, frame.size() - 4);
  const double plain_send = best([&] { sink += encode_frame(hb).size(); });
  const double mac_send = best([&] {
    std::vector<uint8_t> f = encode_frame(hb);
    const Digest d = key({seq, std::span<const uint8_t>(f).subspan(4)});
    f.insert(f.end(), d.begin(), d.end());
    sink += f.size();
  });
  const Digest expected = key({seq, body});
  const double plain_read = best([&] { sink += decode(body).index(); });
  const double mac_read = best([&] {
    sink += digest_equal(key({seq, body}), expected) ? decode(body).index() : 0;
  });
  std::printf("frame MAC on a heartbeat of %zu bytes: send (encode) %.2f -> %.2f us, read (decode) %.2f -> %.2f us per "
              "frame (+%.2f us a heartbeat at each end)%s\n", body.size(), 1e6 * plain_send, 1e6 * mac_send,
              1e6 * plain_read, 1e6 * mac_read, 1e6 * (mac_send - plain_send + mac_read - plain_read) / 2,
              sink == 0 ? " " : "");
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

void run_world(const std::string& self, int world, int procs, double heartbeat_s, double seconds) {
  const Secret secret = generate_secret();
  const double rss0 = rss_mib();
  CoordinatorOptions co;
  co.world = world;
  co.secret = secret;
  co.heartbeat_s = heartbeat_s;
  co.watchdog_s = 600;
  co.connect_timeout_s = 600;
  co.log = [](const std::string& l) {
    if (l.find("ABORT") != std::string::npos) std::fprintf(stderr, "%s\n", l.substr(0, 200).c_str());
  };
  Coordinator coord(co);
  const uint16_t port = coord.endpoint().port;
  // Rank 0 here (the coordinator's own rank, as in a job); the last rank alone in a child (the one
  // that dies); the rest spread over `procs` children.
  Agent rank0(agent_options(0, world, secret, heartbeat_s));
  const double t_connect = now_s();
  std::vector<Child> children;
  const int middle = world - 2, per = (middle + procs - 1) / procs;
  for (int lo = 1; lo < world - 1; lo += per)
    children.push_back(spawn_child(self, lo, std::min(lo + per, world - 1), world, port, secret_hex(secret), heartbeat_s));
  Child victim = spawn_child(self, world - 1, world, world, port, secret_hex(secret), heartbeat_s);
  rank0.connect(coord.endpoint());
  for (auto* c : {&victim}) if (c->line().rfind("ready", 0) != 0) throw std::runtime_error("victim did not connect");
  for (auto& c : children)
    if (c.line().rfind("ready", 0) != 0) throw std::runtime_error("a child did not connect");
  const double connected = now_s() - t_connect;
  const CoordinatorStats s0 = coord.stats();

  // Steady heartbeats: the coordinator's CPU (this process does nothing else meanwhile; rank 0's
  // agent beats too), then, apart, the age of each rank's last frame as the coordinator sees it.
  std::this_thread::sleep_for(std::chrono::duration<double>(heartbeat_s));
  const double cpu0 = cpu_s(), wall0 = now_s();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double cpu = cpu_s() - cpu0, wall = now_s() - wall0;
  const double rss = rss_mib() - rss0;
  const double beats = double(world) * wall / heartbeat_s;
  std::vector<double> ages;
  for (const double t0 = now_s(); now_s() - t0 < std::max(2 * heartbeat_s, 2.0);) {
    for (const RankView& r : coord.ranks()) ages.push_back(r.heartbeat_age_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(97));
  }
  // A heartbeat's delay, sent -> taken in by the coordinator (a heartbeat has no reply: this is its
  // one-way trip through the coordinator's io thread, queued behind every other rank's). Rank 0
  // reports its clock every 100 us, so a heartbeat carries the time it left within 100 us; the
  // coordinator's view says when its last frame came (heartbeat_age_s, the same monotonic clock).
  std::atomic<bool> probing{true};
  std::thread probe([&] {
    while (probing) {
      rank0.report(1, 0, 1, {{"sent_at", now_s()}});
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  std::vector<double> delays;
  double last_sent = 0;
  for (const double t0 = now_s(); now_s() - t0 < std::max(10 * heartbeat_s, 5.0);) {
    const RankView r = coord.ranks()[0];
    const double seen = now_s() - r.heartbeat_age_s;
    for (const auto& [k, v] : r.metrics)
      if (k == "sent_at" && v != last_sent) {
        delays.push_back(seen - v);
        last_sent = v;
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  probing = false;
  probe.join();

  // The coordinated stop: rank 0 asks; done when every rank knows the agreed step.
  const double t_stop = now_s();
  rank0.request_stop("bench");
  double last_stop = 0;
  for (auto* c : {&victim}) last_stop = std::max(last_stop, std::stod(c->line().substr(5)));
  for (auto& c : children) last_stop = std::max(last_stop, std::stod(c.line().substr(5)));

  // One rank's process dies: time until the last rank has aborted.
  const double t_kill = now_s();
  kill(victim.pid, SIGKILL);
  waitpid(victim.pid, nullptr, 0);
  double last_abort = 0;
  for (auto& c : children) {
    const std::string l = c.line();
    if (l.rfind("abort", 0) == 0) last_abort = std::max(last_abort, std::stod(l.substr(6)));
  }
  for (auto& c : children) waitpid(c.pid, nullptr, 0);
  const double coordinator_abort = coord.aborted() ? 1 : 0;

  std::printf("%d ranks (%zu child processes + rank 0 here), heartbeat %.1f s:\n", world, children.size() + 1,
              heartbeat_s);
  std::printf("  connect + authenticate, all ranks: %.2f s (turned away as busy and retried: %llu times; "
              "max_pending %zu)\n", connected, (unsigned long long)s0.refused_busy, co.max_pending);
  std::printf("  coordinator process CPU: %.1f%% of one core over %.1f s = %.1f us per heartbeat (%.0f heartbeats/s)\n",
              100 * cpu / wall, wall, 1e6 * cpu / beats, beats / wall);
  std::printf("  coordinator memory: +%.1f MiB RSS for %d ranks = %.1f KiB per rank\n", rss, world,
              1024 * rss / world);
  std::printf("  age of each rank's last frame at the coordinator: median %.3f s, p99 %.3f s, max %.3f s "
              "(%zu samples; a fresh heartbeat every %.1f s gives a median near %.2f s)\n",
              percentile(ages, 0.5), percentile(ages, 0.99), percentile(ages, 1.0), ages.size(), heartbeat_s,
              heartbeat_s / 2);
  std::printf("  heartbeat delay, sent -> taken in by the coordinator: median %.2f ms, max %.2f ms (%zu heartbeats "
              "of rank 0; each within 0.1 ms of its send)\n", 1e3 * percentile(delays, 0.5), 1e3 * percentile(delays, 1.0),
              delays.size());
  std::printf("  coordinated stop round trip (one rank asks -> every rank knows the step): %.1f ms\n",
              1e3 * (last_stop - t_stop));
  std::printf("  one rank's process killed -> last rank aborted: %.1f ms (coordinator aborted: %s)\n",
              1e3 * (last_abort - t_kill), coordinator_abort ? "yes" : "no");
  std::fflush(stdout);
}

}  // namespace
}  // namespace deepen::control

int main(int argc, char** argv) {
  CLI::App app{"control plane at scale on loopback: connect, heartbeat CPU, stop round trip, failure to abort"};
  std::vector<int> ranks = {1024, 4096};
  int procs = 8;
  double heartbeat = 1, seconds = 10;
  bool child = false;
  int lo = 0, hi = 0, world = 0, port = 0;
  std::string secret;
  app.add_option("--ranks", ranks, "world sizes to simulate")->delimiter(',');
  app.add_option("--procs", procs, "child processes holding the agents");
  app.add_option("--heartbeat", heartbeat, "control.heartbeat_s");
  app.add_option("--seconds", seconds, "steady-state seconds to measure the coordinator over");
  app.add_flag("--child", child)->group("");
  app.add_option("--lo", lo)->group("");
  app.add_option("--hi", hi)->group("");
  app.add_option("--world", world)->group("");
  app.add_option("--port", port)->group("");
  app.add_option("--secret", secret)->group("");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;  // a coordinator holds one socket per rank
  setrlimit(RLIMIT_NOFILE, &nofile);
  if (child) return deepen::control::run_child(lo, hi, world, uint16_t(port), secret, heartbeat);
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  std::printf("control_scale_bench: load average at start: ");
  std::fflush(stdout);
  std::cout << std::ifstream("/proc/loadavg").rdbuf() << std::flush;
  deepen::control::frame_mac_cost();
  for (int w : ranks) deepen::control::run_world(self, w, procs, heartbeat, seconds);
  return 0;
}
