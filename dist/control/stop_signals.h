// Stop signals (SIGTERM, SIGUSR1) that arrive while a job is still starting are kept, not fatal.
#pragma once

namespace deepen::control {

// Installs a handler for SIGTERM and SIGUSR1 that only records the signal. `deepen` calls it before
// any library initializes (launch/main.cpp, from the executable's .preinit_array): a signal that
// arrives before the control plane exists (e.g. Slurm's --signal=B:USR1, or a SIGTERM while LibTorch
// loads or a large teacher is read) would otherwise kill the process (the default action of both).
// The control plane's own handler replaces this one when it starts, and takes what was recorded.
// Only async-signal-safe work and no dynamic initialization: it runs before C++ static initializers.
void catch_early_stop_signals();

// The stop signal recorded before the control plane started (SIGTERM or SIGUSR1), or 0; clears it.
int take_early_stop_signal();

// For commands without a control plane (everything but train and pretrain): gives SIGTERM and
// SIGUSR1 their default action back and, when one came while the process was starting, raises it
// now, so the process ends as it would have without catch_early_stop_signals.
void release_early_stop_signals();

}  // namespace deepen::control
