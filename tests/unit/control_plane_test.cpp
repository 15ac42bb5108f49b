// Control plane over real TCP on 127.0.0.1: ranks are threads with their own RankClient.
// Covers rendezvous, every refusal, hostile frames, heartbeat loss and membership timeouts.
#include "desloc/transport/control_plane.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "desloc/core/error.hpp"

namespace desloc::transport {
namespace {

using namespace std::chrono_literals;

// Aborts the whole test binary if one test hangs: a hang is a bug to report, not to wait on.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit) {
    thread_ = std::thread([this, limit] {
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
        std::fprintf(stderr, "watchdog: test exceeded %lld s; aborting\n",
                     static_cast<long long>(limit.count()));
        std::abort();
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

constexpr std::uint64_t kHash = 0xfeedfacecafebeefull;

class ControlPlane : public ::testing::Test {
 protected:
  Watchdog watchdog_{20s};

  static CoordinatorOptions coord_options(std::size_t sites, std::size_t ranks) {
    CoordinatorOptions o;
    o.num_sites = sites;
    o.ranks_per_site = ranks;
    o.token = JobToken::from_string("job-secret");
    o.config_hash = kHash;
    o.handshake_timeout = 2000ms;
    o.heartbeat_timeout = 1000ms;
    return o;
  }
  static RankClientOptions rank_options(const std::string& site, std::uint32_t rank) {
    RankClientOptions o;
    o.site = site;
    o.rank = rank;
    o.worker_address = {static_cast<std::uint8_t>(site[0]), static_cast<std::uint8_t>(rank)};
    o.token = JobToken::from_string("job-secret");
    o.config_hash = kHash;
    o.heartbeat_interval = 50ms;
    return o;
  }
  static Clock::time_point in(std::chrono::milliseconds d) { return Clock::now() + d; }

  // Runs each rank on its own thread through connect + wait_membership.
  static std::vector<Membership> run_ranks(std::uint16_t port,
                                           const std::vector<RankClientOptions>& ranks) {
    std::vector<Membership> out(ranks.size());
    std::vector<std::exception_ptr> errors(ranks.size());
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < ranks.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          RankClient c(ranks[i]);
          c.connect("127.0.0.1", port, in(5s));
          out[i] = c.wait_membership(in(5s));
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    return out;
  }

  // Expects connect() to be refused with the given error type and message fragment.
  template <class E>
  static void expect_refused(std::uint16_t port, const RankClientOptions& o,
                             const std::string& needle) {
    RankClient c(o);
    try {
      c.connect("127.0.0.1", port, in(5s));
      FAIL() << "connect succeeded; expected refusal containing '" << needle << "'";
    } catch (const E& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
  }
};

TEST_F(ControlPlane, TwoSitesTwoRanksReceiveTheSameMembership) {
  Coordinator coord(coord_options(2, 2));
  const auto port = coord.start(0);
  const auto ms = run_ranks(port, {rank_options("west", 1), rank_options("east", 0),
                                   rank_options("west", 0), rank_options("east", 1)});
  for (const auto& m : ms) EXPECT_EQ(m, ms[0]);
  const auto& m = ms[0];
  EXPECT_EQ(m.epoch, 1u);
  EXPECT_EQ(m.sites, (std::vector<std::string>{"east", "west"}));
  EXPECT_EQ(m.ring_order, (std::vector<std::uint32_t>{0, 1}));
  ASSERT_EQ(m.members.size(), 4u);
  EXPECT_EQ(m.members[0], (MemberEntry{"east", 0, {'e', 0}}));
  EXPECT_EQ(m.members[3], (MemberEntry{"west", 1, {'w', 1}}));
  EXPECT_EQ(coord.registered(), 4u);
  ASSERT_TRUE(coord.membership().has_value());
  EXPECT_EQ(*coord.membership(), m);
  coord.stop();
}

TEST_F(ControlPlane, WrongTokenIsRefusedAndLearnsNothingWhileRealRanksComplete) {
  Coordinator coord(coord_options(2, 1));
  const auto port = coord.start(0);
  auto bad = rank_options("east", 0);
  bad.token = JobToken::from_string("guessed");
  expect_refused<ConfigError>(port, bad, "wrong job token");
  // The impostor did not take east/0's slot: the real ranks still form the world.
  const auto ms = run_ranks(port, {rank_options("east", 0), rank_options("west", 0)});
  EXPECT_EQ(ms[0].members.size(), 2u);
  EXPECT_EQ(coord.registered(), 2u);
}

TEST_F(ControlPlane, MissingTokenIsRefusedWithAReason) {
  Coordinator coord(coord_options(1, 1));
  const auto port = coord.start(0);
  auto o = rank_options("east", 0);
  o.token.reset();
  expect_refused<ConfigError>(port, o, "no job token presented");
  EXPECT_EQ(coord.registered(), 0u);
}

TEST_F(ControlPlane, DuplicateSiteRankIsRefused) {
  Coordinator coord(coord_options(1, 2));
  const auto port = coord.start(0);
  RankClient first(rank_options("east", 0));
  first.connect("127.0.0.1", port, in(5s));
  expect_refused<ConfigError>(port, rank_options("east", 0), "east/0 is already registered");
}

TEST_F(ControlPlane, ConfigHashAndVersionMismatchesAreRefused) {
  Coordinator coord(coord_options(1, 2));
  const auto port = coord.start(0);
  auto o = rank_options("east", 0);
  o.config_hash = 0x1111;
  expect_refused<ConfigError>(port, o, "config hash 0x0000000000001111");
  expect_refused<ConfigError>(port, o, "coordinator's 0xfeedfacecafebeef");
  auto v = rank_options("east", 1);
  v.protocol_version = kProtocolVersion + 1;
  expect_refused<ConfigError>(port, v, "protocol version");
}

TEST_F(ControlPlane, RegistrationsBeyondTheWorldAreRefused) {
  Coordinator coord(coord_options(2, 1));
  const auto port = coord.start(0);
  expect_refused<ConfigError>(port, rank_options("east", 1), "outside 0..0");
  RankClient a(rank_options("east", 0)), b(rank_options("west", 0));
  a.connect("127.0.0.1", port, in(5s));
  b.connect("127.0.0.1", port, in(5s));
  expect_refused<ConfigError>(port, rank_options("north", 0), "expects 2 sites");
  EXPECT_EQ(a.wait_membership(in(5s)).members.size(), 2u);
}

// --- raw-socket helpers for hostile peers

int raw_connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};  // a bounded wait for the coordinator's answer
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Reads until EOF and returns the frames the coordinator sent; `eof` says it closed on us.
std::vector<Frame> read_until_eof(int fd, bool& eof) {
  FrameDecoder dec("coordinator");
  std::vector<Frame> frames;
  std::uint8_t buf[4096];
  eof = false;
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) {
      eof = true;
      break;
    }
    if (n < 0) break;  // timeout or reset
    dec.feed({buf, static_cast<std::size_t>(n)});
    while (auto f = dec.next()) frames.push_back(std::move(*f));
  }
  return frames;
}

void expect_dropped_with(int fd, RejectCode code, const std::string& needle) {
  bool eof = false;
  const auto frames = read_until_eof(fd, eof);
  EXPECT_TRUE(eof) << "the coordinator did not close the connection";
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].type, MessageType::kChallenge);
  const auto r = decode<Reject>(frames[1]);
  EXPECT_EQ(r.code, code);
  EXPECT_NE(r.reason.find(needle), std::string::npos) << r.reason;
}

TEST_F(ControlPlane, HostileFramesCloseOnlyThatConnection) {
  Coordinator coord(coord_options(1, 2));
  const auto port = coord.start(0);

  const int garbage = raw_connect(port);
  ASSERT_GE(garbage, 0);
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_GT(::send(garbage, junk, sizeof(junk), 0), 0);
  expect_dropped_with(garbage, RejectCode::kProtocol, "bad magic");
  ::close(garbage);

  const int oversized = raw_connect(port);
  ASSERT_GE(oversized, 0);
  auto header = encode(AuthResponse{});
  header.resize(kFrameHeaderBytes);
  header[8] = 0, header[9] = 0, header[10] = 0, header[11] = 0x40;  // 1 GiB claimed
  ASSERT_GT(::send(oversized, header.data(), header.size(), 0), 0);
  expect_dropped_with(oversized, RejectCode::kProtocol, "exceeds the limit");
  ::close(oversized);

  const int truncated = raw_connect(port);  // half a frame, then gone
  ASSERT_GE(truncated, 0);
  const auto frame = encode(AuthResponse{std::vector<std::uint8_t>(32, 1)});
  ASSERT_GT(::send(truncated, frame.data(), frame.size() / 2, 0), 0);
  ::close(truncated);

  // The coordinator still serves real ranks.
  const auto ms = run_ranks(port, {rank_options("east", 0), rank_options("east", 1)});
  EXPECT_EQ(ms[0].members.size(), 2u);
}

TEST_F(ControlPlane, StalledHandshakeIsDroppedAtItsDeadline) {
  auto o = coord_options(1, 1);
  o.handshake_timeout = 200ms;
  Coordinator coord(o);
  const auto port = coord.start(0);
  const int fd = raw_connect(port);
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  expect_dropped_with(fd, RejectCode::kHandshakeTimeout, "200 ms");
  EXPECT_LT(Clock::now() - t0, 6s);
  ::close(fd);
}

TEST_F(ControlPlane, SilentRankIsListedMissingWithinTheTimeout) {
  auto o = coord_options(1, 2);
  o.heartbeat_timeout = 300ms;
  Coordinator coord(o);
  const auto port = coord.start(0);
  RankClient a(rank_options("east", 0)), b(rank_options("east", 1));
  a.connect("127.0.0.1", port, in(5s));
  b.connect("127.0.0.1", port, in(5s));
  a.wait_membership(in(5s));
  b.wait_membership(in(5s));
  std::this_thread::sleep_for(400ms);  // beyond the timeout: heartbeats keep both present
  EXPECT_TRUE(coord.missing().empty());

  b.pause_heartbeats(true);
  const auto t0 = Clock::now();
  std::vector<RankId> missing;
  while (Clock::now() - t0 < 3s) {
    missing = coord.missing();
    if (!missing.empty()) break;
    std::this_thread::sleep_for(10ms);
  }
  const auto waited = Clock::now() - t0;
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0], (RankId{"east", 1}));
  EXPECT_GE(waited, 200ms);  // not before the timeout (minus one heartbeat interval)...
  EXPECT_LT(waited, 5s);     // ...and soon after it (slack for a loaded CI machine)

  b.pause_heartbeats(false);  // it comes back
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(coord.missing().empty());
}

TEST_F(ControlPlane, WaitingForAnAbsentRankTimesOutNamingCoordinatorAndRank) {
  Coordinator coord(coord_options(2, 1));
  const auto port = coord.start(0);
  RankClient a(rank_options("east", 0));
  a.connect("127.0.0.1", port, in(5s));
  const auto t0 = Clock::now();
  try {
    a.wait_membership(in(500ms));
    FAIL() << "membership arrived with a rank absent";
  } catch (const TimeoutError& e) {
    const auto waited = Clock::now() - t0;
    EXPECT_GE(waited, 450ms);
    EXPECT_LT(waited, 5s);
    const std::string msg = e.message();
    EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 of 2 ranks registered"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 more site(s)"), std::string::npos) << msg;
  }
  EXPECT_EQ(coord.unregistered(),
            (std::vector<std::string>{"1 more site(s) x 1 rank(s) not yet seen"}));
}

TEST_F(ControlPlane, UnreachableCoordinatorTimesOut) {
  // Take an ephemeral port and release it so nothing listens there.
  std::uint16_t port = 0;
  {
    Coordinator c(coord_options(1, 1));
    port = c.start(0);
  }
  RankClient a(rank_options("east", 0));
  const auto t0 = Clock::now();
  try {
    a.connect("127.0.0.1", port, in(400ms));
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_LT(Clock::now() - t0, 6s);
    EXPECT_NE(e.message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.message();
  }
}

TEST(JobTokenTest, FromFileStripsNewlineAndRejectsMissingOrEmpty) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto path = (dir / ("desloc_token_" + std::to_string(::getpid()))).string();
  { std::ofstream(path) << "s3cret\n"; }
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const auto from_file = JobToken::from_file(path);
  const auto inline_token = JobToken::from_string("s3cret");
  const Nonce n = random_nonce();
  const auto mac = from_file.respond(n);
  EXPECT_TRUE(inline_token.verify(n, mac));
  EXPECT_FALSE(JobToken::from_string("other").verify(n, mac));
  EXPECT_FALSE(inline_token.verify(n, std::span<const std::uint8_t>(mac).first(31)));
  std::filesystem::remove(path);
  EXPECT_THROW(JobToken::from_file(path), ConfigError);
  EXPECT_THROW(JobToken::from_string(""), ConfigError);
  CoordinatorOptions no_token;
  EXPECT_THROW(Coordinator{no_token}, ConfigError);
}

}  // namespace
}  // namespace desloc::transport
