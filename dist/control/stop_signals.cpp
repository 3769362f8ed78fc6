// A record-only handler for the stop signals, from a job's start until the control plane handles them.
#include "dist/control/stop_signals.h"

#include <csignal>

namespace deepen::control {
namespace {
// Written by the signal handler: a handler may only touch a lock-free atomic or sig_atomic_t.
// Constant-initialized (no constructor runs), so it is valid before static initialization.
volatile std::sig_atomic_t early_signal = 0;

extern "C" void record_stop_signal(int signo) { early_signal = signo; }

void set_handler(void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}
}  // namespace

void catch_early_stop_signals() { set_handler(record_stop_signal); }

int take_early_stop_signal() {
  const int signo = early_signal;
  early_signal = 0;
  return signo;
}

void release_early_stop_signals() {
  set_handler(SIG_DFL);
  if (const int signo = take_early_stop_signal()) std::raise(signo);
}

}  // namespace deepen::control
