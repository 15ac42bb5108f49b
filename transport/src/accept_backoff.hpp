// What an acceptor does when accept() fails: out of file descriptors (EMFILE, ENFILE) or
// buffers, every retry fails at once, so an accept loop that retries at once spins a core and
// writes a log line per failure. It waits instead, longer each time, and says so once per
// episode of failures.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "desloc/core/log.hpp"

namespace desloc::transport {

class AcceptBackoff {
 public:
  static constexpr std::chrono::milliseconds kFirst{10};
  static constexpr std::chrono::milliseconds kMost{1000};

  explicit AcceptBackoff(std::string who) : who_(std::move(who)) {}

  // After a failed accept: how long to wait before the next. Logs the first failure of an
  // episode only.
  std::chrono::milliseconds failed(const std::string& why) {
    if (failures_++ == 0) {
      log::warn(
          "{}: accept failed: {}; still listening, retrying after a pause that grows to {} ms "
          "(logged once until an accept succeeds)",
          who_, why, kMost.count());
      wait_ = kFirst;
    } else {
      wait_ = std::min(wait_ * 2, kMost);
    }
    return wait_;
  }
  // After an accept that worked: ends an episode, saying how long it was.
  void succeeded() {
    if (failures_ == 0) return;
    log::info("{}: accepting connections again after {} failed accept(s)", who_, failures_);
    failures_ = 0;
  }
  std::uint64_t failures() const { return failures_; }

 private:
  std::string who_;
  std::uint64_t failures_ = 0;  // in the current episode
  std::chrono::milliseconds wait_{0};
};

}  // namespace desloc::transport
