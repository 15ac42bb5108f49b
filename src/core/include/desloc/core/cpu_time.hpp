// CPU time (user + system) of the calling thread and of the whole process, in seconds: what
// the communication threads cost the compute (`cpu_ms` and `comm_cpu_ms` in the metrics,
// `desloc profile`'s steal); and the wall time those threads ran (`wire_ms`).
#pragma once

#include <atomic>
#include <cstdint>

namespace desloc {

double thread_cpu_seconds();   // the calling thread, since it started
double process_cpu_seconds();  // every thread of the process, live or ended, since it started

// The CPU of short-lived threads, summed: each adds its own as it ends (a thread's clock is
// gone once it has exited). Safe to add from several threads and read from another.
class ThreadCpuTally {
 public:
  void add_calling_thread() { add_seconds(thread_cpu_seconds()); }
  // A span of a thread's CPU (a difference of thread_cpu_seconds()).
  void add_seconds(double seconds) { ns_ += static_cast<std::int64_t>(seconds * 1e9); }
  double seconds() const { return double(ns_.load()) * 1e-9; }

 private:
  std::atomic<std::int64_t> ns_{0};
};

// The wall time of short-lived threads, summed: each measures its own span and adds it as it
// ends. Safe to add from several threads and read from another.
class ThreadWallTally {
 public:
  // A point in time, in seconds (the steady clock).
  static double now();
  void add_since(double start) { ns_ += static_cast<std::int64_t>((now() - start) * 1e9); }
  double seconds() const { return double(ns_.load()) * 1e-9; }

 private:
  std::atomic<std::int64_t> ns_{0};
};

}  // namespace desloc
