// CPU time (user + system) of the calling thread and of the whole process, in seconds: what
// the communication threads cost the compute (`cpu_ms` and `comm_cpu_ms` in the metrics,
// `desloc profile`'s steal).
#pragma once

namespace desloc {

double thread_cpu_seconds();   // the calling thread, since it started
double process_cpu_seconds();  // every thread of the process, live or ended, since it started

}  // namespace desloc
