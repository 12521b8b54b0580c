// SIGHUP: "reload your configuration files" (the scheduler's --auth_tokens).
//
// The handler only counts the signals it gets (async-signal-safe); the code
// that reloads polls ReloadSignalCount() from a thread of its own and reloads
// when the count moved, so several reloaders can share the one signal and a
// burst of signals costs one reload. Installed, SIGHUP no longer ends the
// process (its default action).
#ifndef SPECSERVE_TELEMETRY_RELOAD_SIGNAL_H_
#define SPECSERVE_TELEMETRY_RELOAD_SIGNAL_H_

#include <cstdint>

namespace specserve::telemetry {

void InstallReloadSignalHandler();

// SIGHUPs received since start-up.
uint64_t ReloadSignalCount();

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_RELOAD_SIGNAL_H_
