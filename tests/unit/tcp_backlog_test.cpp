// tcp_backlog (transport/include/desloc/transport/tcp_backlog.hpp) on real loopback sockets: a
// peer that stops reading leaves bytes unacknowledged-or-unsent in the writer's socket, and the
// estimate of their drain time stays short, because the link itself delivers fast. (A shaped
// link's seconds of backlog are measured on the test bed: netbed_link_fault's throttle case.)
#include "desloc/transport/tcp_backlog.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

namespace desloc::transport {
namespace {

using namespace std::chrono_literals;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A connected loopback pair: `writer` connected to `reader`.
void connect_pair(Fd& listener, Fd& writer, Fd& reader) {
  listener.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener.fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.fd, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  writer.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(writer.fd, 0);
  ASSERT_EQ(::connect(writer.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  reader.fd = ::accept(listener.fd, nullptr, nullptr);
  ASSERT_GE(reader.fd, 0);
}

TEST(TcpBacklog, APeerThatStopsReadingLeavesBytesThatWouldDrainFast) {
  Fd listener, writer, reader;
  ASSERT_NO_FATAL_FAILURE(connect_pair(listener, writer, reader));
  const TcpBacklog idle = tcp_backlog();
  EXPECT_EQ(idle.bytes, 0u) << "no socket of this process holds data yet";

  // A first round trip gives the writer a delivery-rate sample; then it fills every buffer.
  std::vector<char> buf(1 << 16, 'x');
  ASSERT_EQ(::write(writer.fd, buf.data(), 1000), 1000);
  ASSERT_EQ(::read(reader.fd, buf.data(), 1000), 1000);
  const auto sampled = std::chrono::steady_clock::now() + 5s;  // the ACK may be delayed
  for (tcp_info info{}; std::chrono::steady_clock::now() < sampled;
       std::this_thread::sleep_for(1ms)) {
    socklen_t len = sizeof info;
    ASSERT_EQ(::getsockopt(writer.fd, IPPROTO_TCP, TCP_INFO, &info, &len), 0);
    if (info.tcpi_delivery_rate > 0) break;
  }
  ASSERT_EQ(::fcntl(writer.fd, F_SETFL, O_NONBLOCK), 0);
  std::size_t wrote = 0;
  for (;;) {
    const ssize_t n = ::write(writer.fd, buf.data(), buf.size());
    if (n < 0) {
      ASSERT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << errno;
      break;
    }
    wrote += static_cast<std::size_t>(n);
  }
  ASSERT_GT(wrote, 0u);
  const TcpBacklog full = tcp_backlog();
  EXPECT_GT(full.bytes, 0u) << "the unread bytes beyond the reader's window stay in the writer";
  EXPECT_LE(full.bytes, wrote);
  EXPECT_GT(full.drain_rate_bps, 0u);
  EXPECT_EQ(ip_text(full.drain_peer), "127.0.0.1") << "the socket it judged leads to the reader";
  EXPECT_LT(full.drain, 1000ms) << "loopback delivers fast: a reader that stopped is no slow "
                                   "link (bytes "
                                << full.drain_bytes << ", rate " << full.drain_rate_bps << " B/s)";

  // The reader drains everything: nothing stays behind.
  std::size_t read = 1000;
  while (read < wrote + 1000) {
    const ssize_t n = ::read(reader.fd, buf.data(), buf.size());
    ASSERT_GT(n, 0);
    read += static_cast<std::size_t>(n);
  }
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (tcp_backlog().bytes != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(tcp_backlog().bytes, 0u);
}

// A reader that closes with bytes unread resets the connection. The writer's descriptor stays
// open, and SIOCOUTQ (sequence numbers) still counts what was in flight: no backlog, since
// those bytes are never delivered (on the bed such a socket made a survivor look slow).
TEST(TcpBacklog, ASocketClosedByAResetIsNoBacklog) {
  Fd listener, writer, reader;
  ASSERT_NO_FATAL_FAILURE(connect_pair(listener, writer, reader));
  std::vector<char> buf(1 << 16, 'x');
  ASSERT_EQ(::write(writer.fd, buf.data(), 1000), 1000);
  ASSERT_EQ(::read(reader.fd, buf.data(), 1000), 1000);
  ASSERT_EQ(::fcntl(writer.fd, F_SETFL, O_NONBLOCK), 0);
  while (::write(writer.fd, buf.data(), buf.size()) > 0) {
  }
  ASSERT_GT(tcp_backlog().bytes, 0u);
  ::close(reader.fd);  // unread data: an RST
  reader.fd = -1;
  const auto until = std::chrono::steady_clock::now() + 5s;
  tcp_info info{};
  do {
    std::this_thread::sleep_for(1ms);
    socklen_t len = sizeof info;
    ASSERT_EQ(::getsockopt(writer.fd, IPPROTO_TCP, TCP_INFO, &info, &len), 0);
  } while (info.tcpi_state != 7 && std::chrono::steady_clock::now() < until);
  ASSERT_EQ(info.tcpi_state, 7) << "the reset closes the writer's connection (TCP_CLOSE)";
  int queued = 0;
  ASSERT_EQ(::ioctl(writer.fd, SIOCOUTQ, &queued), 0);
  EXPECT_GT(queued, 0) << "the kernel still counts the bytes in flight";
  const TcpBacklog after = tcp_backlog();
  EXPECT_EQ(after.bytes, 0u);
  EXPECT_EQ(after.drain, 0ms);
}

}  // namespace
}  // namespace desloc::transport
