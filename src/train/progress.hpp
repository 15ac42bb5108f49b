// Progress output for long runs: a one-line bar with step, loss, tokens/s and ETA on a TTY,
// plain log lines every N steps otherwise (CI logs, files).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace desloc::train {

class ProgressReporter {
 public:
  ProgressReporter(std::int64_t first_step, std::int64_t total_steps, bool tty, int log_every,
                   bool quiet = false);
  // Called after each step (1-based count of completed steps).
  void step(std::int64_t done, float loss, float lr, double tokens_per_s);
  void message(const std::string& line);  // a full line that does not break the bar
  void finish();

 private:
  std::string eta(std::int64_t done) const;
  std::int64_t first_, total_;
  bool tty_;
  int log_every_;
  bool bar_visible_ = false;
  bool quiet_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace desloc::train
