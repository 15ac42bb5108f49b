// tcp_backlog: see tcp_backlog.hpp.
#include "desloc/transport/tcp_backlog.hpp"

#include <dirent.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace desloc::transport {
namespace {

// The kernel's TCP states (include/net/tcp_states.h; not in the uapi headers).
enum TcpState : std::uint8_t {
  kEstablished = 1,
  kFinWait1 = 4,
  kCloseWait = 8,
  kLastAck = 9,
  kClosing = 11,
};

}  // namespace

TcpBacklog tcp_backlog() {
  TcpBacklog out;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/fd"), &closedir);
  if (!dir) return out;
  const int own = dirfd(dir.get());
  while (const dirent* e = readdir(dir.get())) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    // A descriptor another thread closes (or reuses) meanwhile fails a call below or reads a
    // socket's true state: either way nothing is written.
    int protocol = 0;
    socklen_t len = sizeof protocol;
    if (getsockopt(int(fd), SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 ||
        protocol != IPPROTO_TCP)
      continue;
    int queued = 0;
    if (ioctl(int(fd), SIOCOUTQ, &queued) != 0 || queued <= 0) continue;
    tcp_info info{};
    len = sizeof info;
    if (getsockopt(int(fd), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
    // Only a connection that can still deliver: SIOCOUTQ counts sequence numbers, so a socket
    // closed by a reset (TCP_CLOSE, its descriptor not yet closed) still shows what was in
    // flight, and it never drains.
    switch (info.tcpi_state) {
      case kEstablished:
      case kCloseWait:
      case kFinWait1:
      case kClosing:
      case kLastAck:
        break;
      default:
        continue;
    }
    const auto bytes = static_cast<std::uint64_t>(queued);
    out.bytes += bytes;
    // No delivery sample yet (a connection whose first bytes are not acknowledged): no rate to
    // judge by, and a fresh connection across a long round trip is no straggler.
    const std::uint64_t rate = info.tcpi_delivery_rate;
    if (rate == 0) continue;
    const auto drain = std::chrono::milliseconds(
        static_cast<std::int64_t>(std::min(1e9, 1000.0 * double(bytes) / double(rate))));
    if (drain > out.drain || (drain == out.drain && bytes > out.drain_bytes)) {
      out.drain = drain;
      out.drain_bytes = bytes;
      out.drain_rate_bps = info.tcpi_delivery_rate;
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof peer;
      out.drain_peer = getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0
                           ? ip_address(*reinterpret_cast<const sockaddr*>(&peer))
                           : kNoAddress;
    }
  }
  return out;
}

}  // namespace desloc::transport
