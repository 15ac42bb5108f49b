// The Collective conformance suite: the same cases over every backend built here (UCX tcp on
// loopback, eager only, with rendezvous and with the wide-area groups' linger; UCX shared memory;
// NCCL on the GPUs present), ranks as threads: world sizes 1, 2, 3, 5; empty, tiny, unaligned and
// multi-chunk buffers; all-reduce, all-gather, broadcast and barrier with closed-form results; byte
// accounting; back-to-back mixed operations; a missing rank times out at the deadline. UCX-only
// cases (argument checks, a missing address) follow. Every run is under a watchdog.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <latch>
#include <mutex>
#include <numeric>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/transport/ucx_collective.hpp"
#include "test_support.hpp"

namespace desloc::transport {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kWatchdog = 30s;

using test_support::Backend;
using test_support::run_ranks;
using test_support::Watchdog;

// rank r contributes i * (r + 1); the sum is i * n(n+1)/2, exact in float while < 2^24.
void fill(std::span<float> data, int rank) {
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(i) * static_cast<float>(rank + 1);
}
void expect_sum(std::span<const float> data, int size, int rank, std::size_t length) {
  const float factor = static_cast<float>(size * (size + 1) / 2);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (data[i] != static_cast<float>(i) * factor && bad++ < 3) {
      ADD_FAILURE() << "rank " << rank << " length " << length << " element " << i << ": got "
                    << data[i] << ", want " << static_cast<float>(i) * factor;
    }
  }
  EXPECT_EQ(bad, 0u) << "rank " << rank << " length " << length;
}

class CollectiveConformance : public ::testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  void SetUp() override {
    const std::string failure = test_support::backend_unavailable(backend(), world());
    if (failure.empty()) return;
    // The UCX backends work on Debian 12's UCX 1.13: in CI an unusable one is a failure. NCCL
    // needs GPUs, which CI machines do not have.
    const char* ci = std::getenv("CI");
    if (test_support::is_ucx(backend()) && ci != nullptr && std::string(ci) == "true")
      FAIL() << name() << " unusable under CI=true: " << failure;
    GTEST_SKIP() << name() << " unusable here: " << failure;
  }
  Backend backend() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }
  std::string name() const { return test_support::backend_name(backend()); }
  void run(const CollectiveOptions& options, const std::function<void(Collective&, int)>& body) {
    run_ranks(backend(), world(), options, body, kWatchdog);
  }
};

TEST_P(CollectiveConformance, AllReduceSumClosedForm) {
  CollectiveOptions options;
  options.chunk_bytes = 64 << 10;
  const std::vector<std::size_t> lengths = {0, 1, 7, 1000, 1 << 20};
  run(options, [&](Collective& c, int rank) {
    ASSERT_EQ(c.rank(), rank);
    ASSERT_EQ(c.size(), world());
    for (std::size_t length : lengths) {
      std::vector<float> data(length);
      fill(data, rank);
      c.reset_bytes();
      c.all_reduce_sum(data);
      expect_sum(data, world(), rank, length);
      // Ring all-reduce: each rank sends 2(n-1) of n segments; segments differ by at most one
      // element, so allow two floats of rounding per step.
      const OpBytes& b = c.bytes()[CollectiveOp::kAllReduce];
      const double n = world();
      const double ideal = 2.0 * (n - 1) / n * static_cast<double>(length * sizeof(float));
      EXPECT_NEAR(static_cast<double>(b.sent), ideal, 2.0 * (n - 1) * sizeof(float))
          << "length " << length;
      EXPECT_NEAR(static_cast<double>(b.received), ideal, 2.0 * (n - 1) * sizeof(float))
          << "length " << length;
      EXPECT_EQ(b.calls, 1u);
    }
  });
}

TEST_P(CollectiveConformance, SmallChunksAndWindowWrap) {
  CollectiveOptions options;
  options.chunk_bytes = 14;  // rounds down to 3 floats: many chunks, ragged last chunk
  options.max_inflight_chunks = 2;
  run(options, [&](Collective& c, int rank) {
    for (std::size_t length : {std::size_t{5}, std::size_t{1001}}) {
      std::vector<float> data(length);
      fill(data, rank);
      c.all_reduce_sum(data);
      expect_sum(data, world(), rank, length);
    }
  });
}

TEST_P(CollectiveConformance, BackToBackMixedOperations) {
  CollectiveOptions options;
  options.chunk_bytes = 256;
  run(options, [&](Collective& c, int rank) {
    const int n = world();
    for (int iter = 0; iter < 20; ++iter) {
      const std::size_t length = static_cast<std::size_t>(3 + 37 * iter);
      std::vector<float> data(length);
      for (std::size_t i = 0; i < length; ++i)
        data[i] = static_cast<float>((i + static_cast<std::size_t>(iter)) % 17) *
                  static_cast<float>(rank + 1);
      c.all_reduce_sum(data);
      for (std::size_t i = 0; i < length; ++i) {
        ASSERT_EQ(data[i], static_cast<float>((i + static_cast<std::size_t>(iter)) % 17) *
                               static_cast<float>(n * (n + 1) / 2))
            << "iter " << iter << " element " << i;
      }
      const int root = iter % n;
      std::vector<float> b(length + static_cast<std::size_t>(iter),
                           rank == root ? static_cast<float>(iter + 1) : -1.0f);
      c.broadcast(std::span<float>(b), root);
      ASSERT_TRUE(std::all_of(b.begin(), b.end(),
                              [&](float v) { return v == static_cast<float>(iter + 1); }))
          << "broadcast iter " << iter;
      const std::size_t block = static_cast<std::size_t>(iter % 4);  // includes empty blocks
      std::vector<float> mine(block, static_cast<float>(rank * 100 + iter));
      std::vector<float> all(block * static_cast<std::size_t>(n), -1.0f);
      c.all_gather(std::span<const float>(mine), std::span<float>(all));
      for (int r = 0; r < n; ++r) {
        for (std::size_t j = 0; j < block; ++j) {
          ASSERT_EQ(all[static_cast<std::size_t>(r) * block + j],
                    static_cast<float>(r * 100 + iter))
              << "all_gather iter " << iter;
        }
      }
      c.barrier();
    }
    EXPECT_EQ(c.bytes()[CollectiveOp::kAllReduce].calls, 20u);
    EXPECT_EQ(c.bytes()[CollectiveOp::kBarrier].calls, 20u);
  });
}

TEST_P(CollectiveConformance, BroadcastFromEveryRootAndLargeAllGather) {
  CollectiveOptions options;
  options.chunk_bytes = 4096;
  run(options, [&](Collective& c, int rank) {
    const int n = world();
    for (int root = 0; root < n; ++root) {
      std::vector<std::byte> data(10'007);
      for (std::size_t i = 0; i < data.size(); ++i)
        data[i] =
            rank == root
                ? std::byte(static_cast<unsigned char>(i * 31 + static_cast<std::size_t>(root)))
                : std::byte{0};
      c.broadcast(data, root);
      for (std::size_t i = 0; i < data.size(); ++i) {
        ASSERT_EQ(data[i],
                  std::byte(static_cast<unsigned char>(i * 31 + static_cast<std::size_t>(root))))
            << "root " << root << " byte " << i;
      }
    }
    std::vector<std::byte> mine(70'001, std::byte(static_cast<unsigned char>(rank + 1)));
    std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(n));
    c.all_gather(mine, all);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(all[static_cast<std::size_t>(r) * mine.size() + 12345],
                std::byte(static_cast<unsigned char>(r + 1)));
    }
    if (test_support::is_ucx(backend())) {  // NCCL reports only its all-reduce ring volume
      EXPECT_EQ(c.bytes()[CollectiveOp::kAllGather].sent,
                static_cast<std::uint64_t>(n - 1) * mine.size());
    }
  });
}

TEST_P(CollectiveConformance, BarrierWaitsForEveryRank) {
  std::atomic<int> arrived{0};
  run({}, [&](Collective& c, int rank) {
    for (int round = 1; round <= 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * ((rank + round) % world())));
      arrived.fetch_add(1);
      c.barrier();
      EXPECT_GE(arrived.load(), round * world())
          << "rank " << rank << " left barrier " << round << " early";
      c.barrier();  // nobody starts the next round before everyone checked this one
    }
  });
}

// One rank builds its collective but never joins the all-reduce: every other rank must throw
// TimeoutError naming it within the deadline, and nothing hangs.
// Instantiated for world sizes >= 2 only: a missing peer needs a peer.
class CollectivePeerConformance : public CollectiveConformance {};

TEST_P(CollectivePeerConformance, MissingRankTimesOutNamingIt) {
  const int missing = 1;
  CollectiveOptions options;
  options.deadline = 2s;
  std::latch others_done(world() - 1);
  run(options, [&](Collective& c, int rank) {
    if (rank == missing) {
      others_done.wait();
      return;
    }
    // Counts down however this rank leaves, so the missing rank never waits forever.
    struct Done {
      std::latch& latch;
      ~Done() { latch.count_down(); }
    } done{others_done};
    std::vector<float> data(1000, 1.0f);
    const auto start = Clock::now();
    try {
      c.all_reduce_sum(data);
      ADD_FAILURE() << "rank " << rank << ": all_reduce finished without rank " << missing;
    } catch (const TimeoutError& e) {
      const std::string what = e.what();
      if (test_support::is_ucx(backend())) {  // the ring knows where the stall starts
        EXPECT_NE(what.find("stall starts at rank " + std::to_string(missing)), std::string::npos)
            << what;
      }
    }
    const auto elapsed = Clock::now() - start;
    EXPECT_LT(elapsed, options.deadline + 5s)
        << "rank " << rank;  // no hang; slack for a loaded CI machine
    EXPECT_GE(elapsed, options.deadline - 50ms) << "rank " << rank;
    // The group is now unusable, and says so instead of hanging.
    EXPECT_THROW(c.barrier(), TransportError);
  });
}

// UCX shared memory with rendezvous hangs about 1 run in 3 at world sizes 3 and 5: a rank that
// finished its part of a ring stops progressing its worker, while its predecessor's rendezvous
// send still waits for the acknowledgement (ATS) only that worker would send (docs/transport.md,
// "shared memory with rendezvous"). Jobs run eager only (transport.rndv_thresh = "inf"), which
// passes; DESLOC_UCX_TEST_SM_RNDV=1 adds the rendezvous case back for debugging.
std::vector<Backend> backends_under_test() {
  std::vector<Backend> b{Backend::kUcxTcp, Backend::kUcxTcpRendezvous, Backend::kUcxTcpLinger,
                         Backend::kUcxSharedMemory, Backend::kNccl};
  if (std::getenv("DESLOC_UCX_TEST_SM_RNDV") != nullptr)
    b.push_back(Backend::kUcxSharedMemoryRendezvous);
  return b;
}
const auto kBackends = ::testing::ValuesIn(backends_under_test());

std::string param_name(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return std::string(test_support::backend_name(std::get<0>(info.param))) + "_n" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveConformance,
                         ::testing::Combine(kBackends, ::testing::Values(1, 2, 3, 5)), param_name);

INSTANTIATE_TEST_SUITE_P(Backends, CollectivePeerConformance,
                         ::testing::Combine(kBackends, ::testing::Values(2, 3, 5)), param_name);

TEST(UcxCollective, RejectsBadArguments) {
  InMemoryAddressBook book;
  EXPECT_THROW(make_ucx_collective(2, 2, book), Error);
  auto solo = make_ucx_collective(0, 1, book);
  std::vector<float> mine(3, 1.0f), wrong(5);
  EXPECT_THROW(solo->all_gather(std::span<const float>(mine), std::span<float>(wrong)), Error);
  std::vector<float> data(4, 2.0f);
  EXPECT_THROW(solo->broadcast(std::span<float>(data), 1), Error);
}

TEST(UcxCollective, MissingAddressTimesOut) {
  Watchdog watchdog(kWatchdog);
  InMemoryAddressBook book;
  CollectiveOptions options;
  options.deadline = 300ms;
  try {
    make_ucx_collective(0, 2, book, options, test_support::ucx_options(Backend::kUcxTcp));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace desloc::transport
