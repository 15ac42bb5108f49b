// NCCL Collective on the GPUs present: closed-form all-reduce, all-gather and broadcast with
// host buffers of odd sizes; one rank per device as threads (world 1 with one GPU, 2 when
// there are two); the deadline on a communicator whose peer never comes. Skips without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/transport/nccl_collective.hpp"
#include "test_support.hpp"

using namespace desloc;
using namespace desloc::transport;
using namespace std::chrono_literals;

namespace {

// NCCL rank r on device r, ranks as threads (test_support::run_ranks, as the conformance suite).
void run_ranks(int size, const std::function<void(Collective&, int)>& body) {
  CollectiveOptions o;
  o.deadline = 60s;
  desloc::test_support::run_ranks(desloc::test_support::Backend::kNccl, size, o, body,
                                  std::chrono::seconds(180));
}

}  // namespace

TEST(NcclCollective, ClosedFormOperationsOnEveryDevice) {
  if (!nccl_available()) GTEST_SKIP() << "no CUDA device";
  const int n = std::min(cuda_device_count(), 2);
  run_ranks(n, [n](Collective& c, int r) {
    for (std::size_t len : {std::size_t{1}, std::size_t{1001}, std::size_t{1} << 20}) {
      std::vector<float> v(len);
      for (std::size_t i = 0; i < len; ++i) v[i] = float(i % 1000) * float(r + 1);
      c.all_reduce_sum(v);
      const float f = float(n * (n + 1) / 2);
      for (std::size_t i = 0; i < len; ++i) ASSERT_EQ(v[i], float(i % 1000) * f) << i;
    }
    std::vector<float> mine(7, float(r)), all(7 * std::size_t(n));
    c.all_gather(mine, all);
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < 7; ++i) ASSERT_EQ(all[std::size_t(q * 7 + i)], float(q));
    std::vector<float> b(13, r == 0 ? 5.0f : -1.0f);
    c.broadcast(b, 0);
    for (float x : b) ASSERT_EQ(x, 5.0f);
    c.barrier();
    EXPECT_EQ(c.bytes()[CollectiveOp::kAllReduce].calls, 4u);  // 3 + the barrier's
  });
}

TEST(NcclCollective, AMissingPeerTimesOutAtTheDeadline) {
  if (!nccl_available()) GTEST_SKIP() << "no CUDA device";
  CollectiveOptions o;
  o.deadline = 3s;
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 0 of 2; rank 1 never starts.
  EXPECT_THROW(make_nccl_collective(0, 2, nccl_unique_id(), 0, o), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}
