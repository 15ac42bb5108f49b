// SIGINT/SIGTERM before training takes them over: a stop during start-up (rendezvous, loading
// data, building the model) ends the process at once with 130, the status of a stopped run,
// instead of a death by signal (143 after launch's SIGTERM) that reads as a failure.
#pragma once

#include <string>

#include "desloc/core/signals.hpp"

namespace desloc::cli {

// Installs the start-up handlers for its lifetime, leaving an ignored signal ignored (nohup, a
// background job); run_training replaces them with its own and puts them back when it returns.
// The handler writes "<who>: stopped by signal N outside the training loop ..." and calls
// _exit(130): before the loop nothing is written that a stop could leave half done, and after
// it the final checkpoint is already on disk.
class StartupSignals {
 public:
  explicit StartupSignals(const std::string& who);

 private:
  SignalScope scope_;
};

}  // namespace desloc::cli
