// The start-up stop handler: async-signal-safe (a prepared message, write and _exit).
#include "startup_signals.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace desloc::cli {
namespace {

char g_message[256];
std::size_t g_prefix = 0;  // bytes of "<who>: stopped by signal " in g_message
constexpr char kTail[] =
    " outside the training loop (starting up or finishing), so there was nothing to "
    "checkpoint\n";

extern "C" void on_startup_signal(int sig) {
  char text[sizeof(g_message) + 4 + sizeof(kTail)];
  std::size_t n = g_prefix;
  std::memcpy(text, g_message, n);
  // The signal number, without printf.
  char digits[4];
  int d = 0;
  for (int v = sig; v > 0 && d < 4; v /= 10) digits[d++] = static_cast<char>('0' + v % 10);
  while (d > 0) text[n++] = digits[--d];
  std::memcpy(text + n, kTail, sizeof(kTail) - 1);
  n += sizeof(kTail) - 1;
  if (::write(STDERR_FILENO, text, n) < 0) {
  }
  ::_exit(130);
}

// Installs the handler for `sig` unless it is ignored; true when installed.
bool install(int sig, struct sigaction& old) {
  if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) return false;
  struct sigaction sa {};
  sa.sa_handler = on_startup_signal;
  sigemptyset(&sa.sa_mask);
  return ::sigaction(sig, &sa, nullptr) == 0;
}

}  // namespace

StartupSignals::StartupSignals(const std::string& who) {
  const std::string prefix = who + ": stopped by signal ";
  g_prefix = std::min(prefix.size(), sizeof(g_message));
  std::memcpy(g_message, prefix.data(), g_prefix);
  int_installed_ = install(SIGINT, old_int_);
  term_installed_ = install(SIGTERM, old_term_);
}

StartupSignals::~StartupSignals() {
  if (int_installed_) ::sigaction(SIGINT, &old_int_, nullptr);
  if (term_installed_) ::sigaction(SIGTERM, &old_term_, nullptr);
}

}  // namespace desloc::cli
