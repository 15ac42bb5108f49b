// Whether a link's TCP window can cover its bandwidth-delay product. A TCP connection keeps at
// most about its socket buffer in flight, so a link of rate R and round trip T needs buffers of
// at least R x T; Linux's default largest send buffer (net.ipv4.tcp_wmem, 4 MiB) carries 1 Gbit/s
// only up to a 30 ms round trip. Measured on the test bed (docs/transport.md): 1 Gbit at 150 ms
// moved 166 Mbit/s with 4 MiB buffers and 954 Mbit/s with 32 MiB.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "desloc/topology/topology.hpp"

namespace desloc::topology {

// The largest TCP buffers a connection of this process may use, in bytes; 0 = unknown.
struct TcpBuffers {
  double send_max = 0;     // net.ipv4.tcp_wmem's largest, or UCX_TCP_SNDBUF when it is a size
  double receive_max = 0;  // net.ipv4.tcp_rmem's largest, or UCX_TCP_RCVBUF when it is a size
  // net.ipv4.tcp_slow_start_after_idle: 1 (Linux's default), 0, or -1 when unknown.
  int slow_start_after_idle = -1;
};

// Reads this process's network namespace (/proc/sys/net/ipv4/tcp_wmem, tcp_rmem) and UCX's
// environment (UCX_TCP_SNDBUF / UCX_TCP_RCVBUF: "auto" leaves Linux's autotuning in charge).
// Also reads net.ipv4.tcp_slow_start_after_idle.
TcpBuffers read_tcp_buffers();

// A link's window in flight reaches this share of the smaller buffer of its two ends before it
// is called window-limited. On the bed, a window-limited link kept 0.74 of a 4 MiB send buffer
// in flight (166 Mbit/s x 150 ms), and a link at full rate 0.53 of 32 MiB (954 Mbit/s x 150 ms).
inline constexpr double kWindowShare = 0.6;

// One line per link whose measured bandwidth x round trip (2 x latency) reaches kWindowShare of
// min(sender's send_max, receiver's receive_max): its measured rate may be the window's, not the
// link's. Sites missing from `buffers`, or with unknown buffers, are not judged.
std::vector<std::string> window_warnings(const Topology& topo,
                                         const std::map<std::string, TcpBuffers>& buffers);

// A round trip from which restarting slow start after an idle gap is called costly. Measured on
// the bed (docs/transport.md): with 2 s idle before every all-reduce of 16 MiB at 100 Mbit and
// 150 ms, 3 sites took 2314 ms with tcp_slow_start_after_idle = 1 and 1972 ms with 0 (2 sites:
// 1537 and 1522 ms).
inline constexpr double kSlowStartRoundTrip = 0.010;

// One line per site whose kernel restarts slow start after idle (slow_start_after_idle == 1)
// while one of its links (either way) has a round trip of at least kSlowStartRoundTrip: DES-LOC's
// averages are seconds apart, so each would start from a small congestion window. Sites missing
// from `buffers`, or whose setting is unknown, are not judged.
std::vector<std::string> slow_start_warnings(const Topology& topo,
                                             const std::map<std::string, TcpBuffers>& buffers);

}  // namespace desloc::topology
