#include "telemetry/reload_signal.h"

#include <atomic>
#include <csignal>

namespace specserve::telemetry {
namespace {

std::atomic<uint64_t> reload_signals{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the SIGHUP handler must not take a lock");

void OnReloadSignal(int) {
  reload_signals.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void InstallReloadSignalHandler() {
  struct sigaction action = {};
  action.sa_handler = OnReloadSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGHUP, &action, nullptr);
}

uint64_t ReloadSignalCount() {
  return reload_signals.load(std::memory_order_relaxed);
}

}  // namespace specserve::telemetry
