// SIGINT and SIGTERM handled for a scope: the one way desloc takes the stop signals (the
// training loop's stop, launch's count of them, the start-up exit), each with its own handler.
#pragma once

#include <csignal>

namespace desloc {

// Installs `handler` for SIGINT and SIGTERM for its lifetime and puts the old handlers back
// when it ends. With `keep_ignored`, a signal ignored when the scope opens (nohup, a background
// job) stays ignored. The handler must be async-signal-safe.
class SignalScope {
 public:
  explicit SignalScope(void (*handler)(int), bool keep_ignored = false);
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction old_[2]{};  // SIGINT's, SIGTERM's
  bool installed_[2]{};
};

}  // namespace desloc
