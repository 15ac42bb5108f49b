// The profile's long-fat-link check (topology/tcp_window): which links are called window-limited,
// on the cases measured on the test bed, and where the buffer sizes come from.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "desloc/topology/tcp_window.hpp"

namespace desloc::topology {
namespace {

constexpr double kMiB = 1024.0 * 1024;

Topology two_sites(double mbit_ab, double one_way_ms) {
  Topology t;
  t.sites = {{"A", 0.1}, {"B", 0.1}};
  t.links = {{"A", "B", mbit_ab * 1e6 / 8, one_way_ms / 1e3, 0},
             {"B", "A", 100e6 / 8, 0.0001, 0}};  // B -> A: 100 Mbit, no delay
  return t;
}

TEST(TcpWindow, A1GbitLinkAt150MsHeldBackBy4MiBBuffersIsNamed) {
  // Measured on the bed: 1 Gbit at 150 ms with 4 MiB buffers moved 166 Mbit/s.
  const std::map<std::string, TcpBuffers> buffers{{"A", {4 * kMiB, 32 * kMiB}},
                                                  {"B", {4 * kMiB, 32 * kMiB}}};
  const auto w = window_warnings(two_sites(166, 75), buffers);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("link A -> B"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("A's largest send buffer"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("net.ipv4.tcp_wmem on A"), std::string::npos) << w[0];
}

TEST(TcpWindow, LinksWhoseWindowFitsAreLeftAlone) {
  const std::map<std::string, TcpBuffers> small{{"A", {4 * kMiB, 4 * kMiB}},
                                                {"B", {4 * kMiB, 4 * kMiB}}};
  // 100 Mbit at 150 ms: 1.9 MB in flight, 45% of 4 MiB (the bed moved 0.89 of the rate).
  EXPECT_TRUE(window_warnings(two_sites(100, 75), small).empty());
  // The same 1 Gbit, 150 ms link at full rate with 32 MiB buffers (measured): 17.9 MB, 53%.
  const std::map<std::string, TcpBuffers> large{{"A", {32 * kMiB, 32 * kMiB}},
                                                {"B", {32 * kMiB, 32 * kMiB}}};
  EXPECT_TRUE(window_warnings(two_sites(954, 75), large).empty());
  // 10 Gbit at 150 ms would need 187.5 MB: 32 MiB buffers are named.
  EXPECT_FALSE(window_warnings(two_sites(10000, 75), large).empty());
}

TEST(TcpWindow, TheReceiversBufferCountsAndUnknownSitesAreNotJudged) {
  const std::map<std::string, TcpBuffers> buffers{{"A", {64 * kMiB, 64 * kMiB}},
                                                  {"B", {64 * kMiB, 2 * kMiB}}};
  const auto w = window_warnings(two_sites(100, 20), buffers);  // 0.5 MB of 2 MiB: 24%
  EXPECT_TRUE(w.empty());
  const auto w2 = window_warnings(two_sites(300, 20), buffers);  // 1.5 MB of 2 MiB: 72%
  ASSERT_EQ(w2.size(), 1u);
  EXPECT_NE(w2[0].find("B's largest receive buffer"), std::string::npos) << w2[0];
  EXPECT_TRUE(window_warnings(two_sites(1000, 75), {{"A", {4 * kMiB, 4 * kMiB}}}).empty());
  EXPECT_TRUE(window_warnings(two_sites(1000, 75), {{"A", {}}, {"B", {}}}).empty());
}

TEST(TcpWindow, BuffersComeFromUcxWhenItFixesThemAndFromTheKernelOtherwise) {
  ::unsetenv("UCX_TCP_SNDBUF");
  ::setenv("UCX_TCP_RCVBUF", "auto", 1);
  const TcpBuffers kernel = read_tcp_buffers();
  EXPECT_GT(kernel.send_max, 0);  // /proc/sys/net/ipv4/tcp_wmem exists on Linux
  EXPECT_GT(kernel.receive_max, 0);
  ::setenv("UCX_TCP_SNDBUF", "8M", 1);
  ::setenv("UCX_TCP_RCVBUF", "65536", 1);
  const TcpBuffers ucx = read_tcp_buffers();
  EXPECT_EQ(ucx.send_max, 8 * kMiB);
  EXPECT_EQ(ucx.receive_max, 65536);
  ::unsetenv("UCX_TCP_SNDBUF");
  ::unsetenv("UCX_TCP_RCVBUF");
}

}  // namespace
// A site that restarts slow start after idle is named when one of its links has a long round
// trip; a short one, a setting of 0 or an unknown one is not.
TEST(TcpWindow, SlowStartAfterIdleIsNamedOnLongRoundTrips) {
  TcpBuffers on{4 * kMiB, 4 * kMiB, 1}, off{4 * kMiB, 4 * kMiB, 0}, unknown{4 * kMiB, 4 * kMiB};
  const auto w = slow_start_warnings(two_sites(100, 75), {{"A", on}, {"B", off}});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("site A: net.ipv4.tcp_slow_start_after_idle = 1 with round trips up to "
                      "150.0 ms"),
            std::string::npos)
      << w[0];
  EXPECT_TRUE(slow_start_warnings(two_sites(100, 2), {{"A", on}, {"B", on}}).empty());  // 4 ms
  EXPECT_TRUE(slow_start_warnings(two_sites(100, 75), {{"A", unknown}, {"B", off}}).empty());
  // B has A -> B's 150 ms round trip too, though its own outgoing link is short.
  EXPECT_EQ(slow_start_warnings(two_sites(100, 75), {{"A", off}, {"B", on}}).size(), 1u);
}

}  // namespace desloc::topology
