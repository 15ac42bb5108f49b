// Progress bar / log lines.
#include "train/progress.hpp"

#include <fmt/format.h>

#include <cstdio>

namespace desloc::train {

ProgressReporter::ProgressReporter(std::int64_t first_step, std::int64_t total_steps, bool tty,
                                   int log_every, bool quiet)
    : first_(first_step),
      total_(total_steps),
      tty_(tty),
      log_every_(log_every > 0 ? log_every : 1),
      quiet_(quiet) {}

std::string ProgressReporter::eta(std::int64_t done) const {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::int64_t run = done - first_;
  if (run <= 0) return "?";
  const auto left = static_cast<std::int64_t>(elapsed / double(run) * double(total_ - done));
  return left >= 3600 ? fmt::format("{}h{:02}m", left / 3600, (left % 3600) / 60)
                      : fmt::format("{}m{:02}s", left / 60, left % 60);
}

void ProgressReporter::step(std::int64_t done, float loss, float lr, double tokens_per_s) {
  if (quiet_) return;
  if (tty_) {
    constexpr int kWidth = 28;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r[%s] step %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s \x1b[K",
                 bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_), loss,
                 lr, tokens_per_s, eta(done).c_str());
    std::fflush(stderr);
    bar_visible_ = true;
  } else if (done % log_every_ == 0 || done == total_ || done == first_ + 1) {
    std::fprintf(stderr, "step %lld/%lld loss %.4f lr %.3e %.0f tok/s eta %s\n",
                 static_cast<long long>(done), static_cast<long long>(total_), loss, lr,
                 tokens_per_s, eta(done).c_str());
  }
}

void ProgressReporter::message(const std::string& line) {
  if (quiet_) return;
  if (bar_visible_) std::fputs("\r\x1b[K", stderr);
  std::fprintf(stderr, "%s\n", line.c_str());
  bar_visible_ = false;
}

void ProgressReporter::finish() {
  if (bar_visible_) std::fputc('\n', stderr);
  bar_visible_ = false;
}

}  // namespace desloc::train
