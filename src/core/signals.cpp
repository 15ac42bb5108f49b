// SignalScope: sigaction in, sigaction back out.
#include "desloc/core/signals.hpp"

namespace desloc {
namespace {
constexpr int kSignals[2] = {SIGINT, SIGTERM};
}  // namespace

SignalScope::SignalScope(void (*handler)(int), bool keep_ignored) {
  for (int i = 0; i < 2; ++i) {
    if (::sigaction(kSignals[i], nullptr, &old_[i]) != 0) continue;
    if (keep_ignored && old_[i].sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    installed_[i] = ::sigaction(kSignals[i], &sa, nullptr) == 0;
  }
}

SignalScope::~SignalScope() {
  for (int i = 0; i < 2; ++i)
    if (installed_[i]) ::sigaction(kSignals[i], &old_[i], nullptr);
}

}  // namespace desloc
