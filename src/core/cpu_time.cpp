// CPU and wall clocks (cpu_time.hpp).
#include "desloc/core/cpu_time.hpp"

#include <ctime>

namespace desloc {
namespace {
double read(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}
}  // namespace

double thread_cpu_seconds() { return read(CLOCK_THREAD_CPUTIME_ID); }
double process_cpu_seconds() { return read(CLOCK_PROCESS_CPUTIME_ID); }
double steady_seconds() { return read(CLOCK_MONOTONIC); }

}  // namespace desloc
