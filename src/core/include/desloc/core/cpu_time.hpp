// CPU time (user + system) of the calling thread and of the whole process, in seconds: what
// the communication threads cost the compute (`cpu_ms` and `comm_cpu_ms` in the metrics,
// `desloc profile`'s steal).
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
  void add_calling_thread() { ns_ += static_cast<std::int64_t>(thread_cpu_seconds() * 1e9); }
  double seconds() const { return double(ns_.load()) * 1e-9; }

 private:
  std::atomic<std::int64_t> ns_{0};
};

}  // namespace desloc
