// Stop signals (SIGTERM, SIGUSR1) that arrive while a job is still starting are kept, not fatal.
#pragma once

namespace deepen::control {

// Installs a handler for SIGTERM and SIGUSR1 that only records the signal. Call first thing in a
// job: a signal that arrives before the control plane exists (e.g. Slurm's --signal=B:USR1 while a
// large teacher loads) would otherwise kill the process (the default action of both). The control
// plane's own handler replaces this one when it starts, and takes what was recorded.
void catch_early_stop_signals();

// The stop signal recorded before the control plane started (SIGTERM or SIGUSR1), or 0; clears it.
int take_early_stop_signal();

}  // namespace deepen::control
