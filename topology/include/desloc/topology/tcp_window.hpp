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
};

// Reads this process's network namespace (/proc/sys/net/ipv4/tcp_wmem, tcp_rmem) and UCX's
// environment (UCX_TCP_SNDBUF / UCX_TCP_RCVBUF: "auto" leaves Linux's autotuning in charge).
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

}  // namespace desloc::topology
