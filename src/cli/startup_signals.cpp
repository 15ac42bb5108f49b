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

using Handler = void (*)(int);

// The handler, its message's prefix prepared before it is installed.
Handler prepared(const std::string& who) {
  const std::string prefix = who + ": stopped by signal ";
  g_prefix = std::min(prefix.size(), sizeof(g_message));
  std::memcpy(g_message, prefix.data(), g_prefix);
  return on_startup_signal;
}

}  // namespace

StartupSignals::StartupSignals(const std::string& who)
    : scope_(prepared(who), /*keep_ignored=*/true) {}

}  // namespace desloc::cli
