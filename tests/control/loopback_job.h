// The control-plane tests' setup, written once: coordinator and agents on loopback with fast timings,
// a simulated trainer loop, captured aborts, and agents or a coordinator as child processes.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dist/control/agent.h"
#include "dist/control/coordinator.h"
#include "dist/control/endpoint.h"
#include "dist/control/policy.h"
#include "dist/control/secret.h"
#include "tests/control/control_test_util.h"

namespace deepen::control::test_support {

using deepen::test::eventually;

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
  std::string all() {
    std::lock_guard lock(mu);
    std::string text;
    for (const auto& l : lines) text += l + "\n";
    return text;
  }
};

inline CoordinatorOptions fast_coordinator(int world, const Secret& secret, LogSink& log) {
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

inline AgentOptions fast_agent(int rank, int world, const Secret& secret, LogSink& log) {
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

inline int64_t step_of(const Coordinator& c, int rank) { return c.ranks()[size_t(rank)].step; }

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

// Agents for ranks 0 .. n-1 of a `world`-rank job, fast_agent options (then `tune`), each abort
// captured, connected one after the other to `coordinator`.
struct Agents {
  std::deque<AbortCatcher> aborts;  // a deque: catchers hold a mutex and must not move
  std::vector<std::unique_ptr<Agent>> list;
  Agents(int n, int world, const Secret& secret, LogSink& log, const Endpoint& coordinator,
         const std::function<void(AgentOptions&)>& tune = nullptr) {
    for (int r = 0; r < n; ++r) {
      AgentOptions o = fast_agent(r, world, secret, log);
      o.on_abort = aborts.emplace_back().fn();
      if (tune) tune(o);
      list.push_back(std::make_unique<Agent>(o));
    }
    for (auto& a : list) a->connect(coordinator);
  }
  Agent& operator[](int rank) { return *list[size_t(rank)]; }
  std::optional<AbortInfo> abort_of(int rank) { return aborts[size_t(rank)].get(); }
};

// A coordinator for `world` ranks on loopback (fast_coordinator options, then `tune`) and connected
// agents for ranks 0 .. local-1: the start of every in-process test.
struct LocalJob {
  Secret secret = generate_secret();
  LogSink log;
  std::unique_ptr<Coordinator> coord;
  Agents agents;

  LocalJob(int world, int local, const std::function<void(CoordinatorOptions&)>& tune = nullptr)
      : coord(start(world, tune)), agents(local, world, secret, log, coord->endpoint()) {}
  Agent& agent(int rank) { return agents[rank]; }
  std::optional<AbortInfo> abort_of(int rank) { return agents.abort_of(rank); }
  int64_t step(int rank) const { return step_of(*coord, rank); }

 private:
  std::unique_ptr<Coordinator> start(int world, const std::function<void(CoordinatorOptions&)>& tune) {
    CoordinatorOptions o = fast_coordinator(world, secret, log);
    if (tune) tune(o);
    return std::make_unique<Coordinator>(o);
  }
};

// ---- child processes: this test binary re-executed (tests/control/child_process_test.cpp) -------

inline std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "";
}

// This test binary, re-executed to run only ControlChild.DISABLED_Main with `vars` set.
class ChildProcess : public deepen::test::TestProcess {
 public:
  ChildProcess(const std::map<std::string, std::string>& vars, const std::string& tag)
      : TestProcess({self_exe(), "--gtest_filter=ControlChild.DISABLED_Main", "--gtest_also_run_disabled_tests"},
                    vars, "control_" + tag) {}
};

// A child agent with a trainer loop of one step per `period_ms`, which stops stepping (heartbeats
// go on) at `idle_at` and, with `signals`, turns SIGTERM/SIGUSR1 into a coordinated stop.
inline std::map<std::string, std::string> agent_child_env(int rank, int world, const Endpoint& ep,
                                                          const Secret& secret, int period_ms,
                                                          int idle_at = -1, bool signals = false) {
  return {{"DEEPEN_CONTROL_CHILD", "agent"},  {"CHILD_RANK", std::to_string(rank)},
          {"CHILD_WORLD", std::to_string(world)}, {"CHILD_ENDPOINT", ep.str()},
          {"DEEPEN_JOB_SECRET", secret_hex(secret)}, {"CHILD_PERIOD_MS", std::to_string(period_ms)},
          {"CHILD_IDLE_AT", std::to_string(idle_at)}, {"CHILD_SIGNALS", signals ? "1" : "0"}};
}

// A coordinator for `world` ranks in a child process, for the tests that kill or freeze it; its
// endpoint comes back through a file in a folder of its own, removed afterwards.
struct CoordinatorProcess {
  std::filesystem::path dir;
  ChildProcess process;
  Endpoint endpoint;

  CoordinatorProcess(int world, const Secret& secret, const std::string& tag)
      : dir(fresh_dir(tag)),
        process({{"DEEPEN_CONTROL_CHILD", "coordinator"}, {"CHILD_WORLD", std::to_string(world)},
                 {"DEEPEN_JOB_SECRET", secret_hex(secret)}, {"CHILD_ENDPOINT_FILE", (dir / "endpoint").string()}},
                tag),
        endpoint(wait_for_endpoint_file((dir / "endpoint").string(), 15)) {}
  ~CoordinatorProcess() {  // the process member then kills and reaps the child if it still runs
    std::error_code ignore;
    std::filesystem::remove_all(dir, ignore);
  }
  void signal(int sig) { process.signal(sig); }

 private:
  static std::filesystem::path fresh_dir(const std::string& tag) {
    const auto dir = std::filesystem::temp_directory_path() / ("deepen_" + tag + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }
};

}  // namespace deepen::control::test_support
