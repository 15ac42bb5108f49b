// What this process has handed to TCP that its peers have not acknowledged yet: the straggler
// rule's view of a slow outbound link that UCX cannot see (an eager send completes once the
// kernel took the bytes, and a shaped link queues them there).
#pragma once

#include <chrono>
#include <cstdint>

#include "desloc/transport/ip_address.hpp"

namespace desloc::transport {

struct TcpBacklog {
  std::uint64_t bytes = 0;  // unacknowledged or unsent, over every TCP socket of the process
  // The longest one socket would take to deliver its backlog at the rate it last delivered
  // (TCP_INFO's delivery rate): seconds behind a slow link, none where the link keeps up. A
  // socket whose peer stopped reading holds bytes but drains fast once it reads. Sockets with
  // no delivery sample yet are left out of it.
  std::chrono::milliseconds drain{0};
  std::uint64_t drain_bytes = 0;      // that socket's backlog
  std::uint64_t drain_rate_bps = 0;   // and its delivery rate, bytes per second
  IpAddress drain_peer = kNoAddress;  // and the address it is connected to
};

// Reads every TCP socket among this process's descriptors (Linux: SIOCOUTQ and TCP_INFO); zeros
// where /proc/self/fd cannot be read.
TcpBacklog tcp_backlog();

}  // namespace desloc::transport
