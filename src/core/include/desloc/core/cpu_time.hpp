// CPU time (user + system) of the calling thread and of the whole process, in seconds: what
// the communication threads cost the compute (`cpu_ms` and `comm_cpu_ms` in the metrics,
// `desloc profile`'s steal); and the wall time those threads ran (`wire_ms`).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace desloc {

double thread_cpu_seconds();   // the calling thread, since it started
double process_cpu_seconds();  // every thread of the process, live or ended, since it started

// A steady clock's reading, in seconds: a thread's wall-time span is a difference of two.
double steady_seconds();
// Seconds of std::chrono::steady_clock since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds added by several threads and read by another (each adds a span of its own as it
// ends: its CPU, or the wall time it ran).
class SecondsTally {
 public:
  void add_seconds(double seconds) { ns_ += static_cast<std::int64_t>(seconds * 1e9); }
  double seconds() const { return double(ns_.load()) * 1e-9; }

 private:
  std::atomic<std::int64_t> ns_{0};
};

// The CPU of short-lived threads, summed: each adds its own as it ends (a thread's clock is
// gone once it has exited).
class ThreadCpuTally : public SecondsTally {
 public:
  void add_calling_thread() { add_seconds(thread_cpu_seconds()); }
};

}  // namespace desloc
