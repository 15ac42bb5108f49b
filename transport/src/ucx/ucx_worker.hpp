// UcxWorker: RAII owner of a single-threaded ucp_worker whose waits sleep on the worker's event
// fd (ucp_worker_arm + poll) after a short spin, so an idle transfer does not burn a core.
#pragma once

#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "desloc/transport/ucx_collective.hpp"
#include "ucx_context.hpp"

namespace desloc::transport::ucx {

class UcxWorker {
 public:
  using Clock = std::chrono::steady_clock;

  UcxWorker(const UcxContext& context, int spin_iterations,
            std::chrono::microseconds linger = std::chrono::microseconds(0));
  ~UcxWorker();
  UcxWorker(UcxWorker&& other) noexcept;
  UcxWorker& operator=(UcxWorker&& other) noexcept;
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h get() const { return worker_; }
  WorkerAddress address() const;

  unsigned progress() { return ucp_worker_progress(worker_); }

  // Progresses until done() holds (true) or the deadline passes (false). Between bursts of
  // work it spins spin_iterations idle rounds, then, with a linger, sleeps that long and
  // progresses what arrived meanwhile, for as long as each linger brings work; after one
  // that brings none (or with no linger) it sleeps on the event fd. A stream through the tcp
  // transport wakes an event-fd sleeper for every few packets or ACKs; a linger wakes the
  // thread once per linger instead, for at most a linger's latency per wait.
  //
  // A stall, a gap between two looks at the clock far longer than any sleep here, means this
  // process did not run (SIGSTOP, a suspended host or VM): the deadline moves out by the gap,
  // which is no peer's silence. `looked` is the caller's last look (an operation's start, or
  // where its previous wait left it), so a stall between two waits of one operation counts
  // too; both are updated, and the operation keeps the extension.
  template <class Done>
  bool wait_until(Done&& done, Clock::time_point& deadline, Clock::time_point& looked) {
    int idle = 0;
    bool linger_next = linger_.count() > 0;
    const auto expired = [&](Clock::time_point now) {
      if (now - looked > kStall) deadline += now - looked;
      looked = now;
      return now >= deadline;
    };
    for (;;) {
      if (done()) return true;
      const unsigned events = progress();
      if (done()) return true;
      if (events != 0) {
        idle = 0;
        linger_next = linger_.count() > 0;
        if (expired(Clock::now())) return false;
        continue;
      }
      if (idle++ < spin_iterations_) continue;
      idle = 0;
      const auto now = Clock::now();
      if (expired(now)) return false;
      if (linger_next) {
        linger_next = false;
        std::this_thread::sleep_for(std::min<Clock::duration>(linger_, deadline - now));
        continue;
      }
      sleep_for_events(deadline);
      linger_next = linger_.count() > 0;
    }
  }
  template <class Done>
  bool wait_until(Done&& done, Clock::time_point&& deadline) {
    Clock::time_point d = deadline, looked = Clock::now();
    return wait_until(std::forward<Done>(done), d, looked);
  }

  // Arms the worker and sleeps on its event fd until an event or the deadline (capped at
  // kMaxSleep as a guard against a transport that never signals). Returns at once if UCX
  // still has events queued.
  void sleep_for_events(Clock::time_point deadline);

  static constexpr std::chrono::milliseconds kMaxSleep{100};
  // A gap between two looks at the clock past this is a stall of the process, not a wait.
  static constexpr std::chrono::milliseconds kStall{2000};

 private:
  void destroy() noexcept;

  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  int spin_iterations_ = 0;
  std::chrono::microseconds linger_{0};
};

}  // namespace desloc::transport::ucx
