// TCP windows against bandwidth-delay products: tcp_window.hpp.
#include "desloc/topology/tcp_window.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

namespace desloc::topology {
namespace {

// The third field of a "min default max" sysctl, or 0.
double sysctl_max(const char* path) {
  std::ifstream in(path);
  double lo = 0, def = 0, hi = 0;
  if (!(in >> lo >> def >> hi)) return 0;
  return hi;
}

// A UCX memory size ("8388608", "8M", "64K", "1G"); nullopt for "auto" or anything else.
std::optional<double> ucx_size(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || !(value > 0)) return std::nullopt;
  const std::string unit(end);
  double scale = 1;
  if (unit == "K" || unit == "k" || unit == "KB")
    scale = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MB")
    scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GB")
    scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B" && unit != "b")
    return std::nullopt;
  return value * scale;
}

// An integer sysctl, or -1.
int sysctl_int(const char* path) {
  std::ifstream in(path);
  int v = -1;
  if (!(in >> v)) return -1;
  return v;
}

std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024)); }

}  // namespace

TcpBuffers read_tcp_buffers() {
  TcpBuffers b;
  b.send_max = ucx_size("UCX_TCP_SNDBUF").value_or(sysctl_max("/proc/sys/net/ipv4/tcp_wmem"));
  b.receive_max = ucx_size("UCX_TCP_RCVBUF").value_or(sysctl_max("/proc/sys/net/ipv4/tcp_rmem"));
  b.slow_start_after_idle = sysctl_int("/proc/sys/net/ipv4/tcp_slow_start_after_idle");
  return b;
}

std::vector<std::string> window_warnings(const Topology& topo,
                                         const std::map<std::string, TcpBuffers>& buffers) {
  std::vector<std::string> out;
  for (const LinkProfile& link : topo.links) {
    const auto from = buffers.find(link.from), to = buffers.find(link.to);
    if (from == buffers.end() || to == buffers.end()) continue;
    const double send = from->second.send_max, receive = to->second.receive_max;
    if (!(send > 0 && receive > 0)) continue;
    const double limit = std::min(send, receive);
    const double rtt = 2 * link.latency_s;
    const double bdp = link.bandwidth_bps * rtt;
    if (bdp < kWindowShare * limit) continue;
    const std::string which = send <= receive ? fmt::format("{}'s largest send buffer", link.from)
                                              : fmt::format("{}'s largest receive buffer", link.to);
    out.push_back(fmt::format(
        "link {} -> {}: {:.1f} Mbit/s x {:.1f} ms round trip keeps {} in flight, {:.0f}% of {} "
        "({}): the window may be what limits this link, so its real rate may be higher. Raise "
        "the third field of net.ipv4.tcp_wmem on {} and of net.ipv4.tcp_rmem on {} to at least "
        "twice the link's rate x round trip (docs/transport.md, \"Long fat links\"), then "
        "profile again",
        link.from, link.to, link.bandwidth_bps * 8 / 1e6, rtt * 1e3, mib(bdp), 100 * bdp / limit,
        which, mib(limit), link.from, link.to));
  }
  return out;
}

std::vector<std::string> slow_start_warnings(const Topology& topo,
                                             const std::map<std::string, TcpBuffers>& buffers) {
  std::vector<std::string> out;
  for (const auto& [site, b] : buffers) {
    if (b.slow_start_after_idle != 1) continue;
    double rtt = 0;
    for (const LinkProfile& link : topo.links)
      if (link.from == site || link.to == site) rtt = std::max(rtt, 2 * link.latency_s);
    if (rtt < kSlowStartRoundTrip) continue;
    out.push_back(fmt::format(
        "site {}: net.ipv4.tcp_slow_start_after_idle = 1 with round trips up to {:.1f} ms: every "
        "average after an idle gap restarts TCP's congestion window (on the test bed at 150 ms, "
        "a 3-site all-reduce of 16 MiB after 2 s idle took 17% longer). Set it to 0 on {} "
        "(sysctl -w net.ipv4.tcp_slow_start_after_idle=0; docs/transport.md)",
        site, rtt * 1e3, site));
  }
  return out;
}

}  // namespace desloc::topology
