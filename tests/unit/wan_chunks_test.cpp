// The wide-area path's arithmetic and integrity: UCX ring all-reduce equals
// ring_sum_reference bit for bit (so a multi-process run can match the in-process one), the
// two-phase open/connect API, and chunk headers (a step, state or epoch mismatch and a
// corrupted payload are errors naming the context, never averaged in).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/transport/chunk_header.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/ucx_collective.hpp"
#include "test_support.hpp"

namespace desloc::transport {
namespace {

using namespace std::chrono_literals;

// Ranks as threads over UCX tcp, connected as a `desloc worker` connects (test_support).
void run_ranks(int size, const CollectiveOptions& options,
               const std::function<void(Collective&, int)>& body) {
  test_support::run_ranks(test_support::Backend::kUcxTcp, size, options, body);
}

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 20) - 10);
  return v;
}

class RingOrder : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(RingOrder, UcxAllReduceEqualsTheReferenceBitForBit) {
  const auto [n, headers] = GetParam();
  CollectiveOptions options;
  options.chunk_bytes = 256;  // many chunks per segment
  options.chunk_headers = headers;
  options.deadline = 20s;
  for (std::size_t len :
       {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{4099}}) {
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < n; ++r)
      inputs.push_back(random_floats(len, 100u * unsigned(len) + unsigned(r)));
    std::vector<std::span<const float>> views(inputs.begin(), inputs.end());
    std::vector<float> want(len);
    ring_sum_reference(views, want);
    // The reference is not the naive sum: otherwise this test could not tell orders apart.
    if (len == 4099 && n >= 3) {
      std::size_t differs = 0;
      for (std::size_t i = 0; i < len; ++i) {
        float naive = 0;
        for (int r = 0; r < n; ++r) naive += inputs[std::size_t(r)][i];
        differs += naive != want[i];
      }
      EXPECT_GT(differs, 0u) << "inputs too benign to distinguish summation orders";
    }
    std::vector<std::vector<float>> got = inputs;
    run_ranks(n, options, [&](Collective& c, int r) {
      c.set_label({5, 1, 0});
      c.all_reduce_sum(got[std::size_t(r)]);
    });
    for (int r = 0; r < n; ++r)
      ASSERT_TRUE(len == 0 ||
                  std::memcmp(got[std::size_t(r)].data(), want.data(), len * sizeof(float)) == 0)
          << "rank " << r << " of " << n << ", length " << len;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, RingOrder,
                         ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Bool()),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_headers" : "_raw");
                         });

TEST(RingOrder, BlocksCoverTheBufferInOrder) {
  for (std::size_t count : {0u, 1u, 5u, 8u, 9u, 1001u})
    for (int parts : {1, 2, 3, 4, 7}) {
      std::size_t next = 0;
      for (int p = 0; p < parts; ++p) {
        const Range b = block(count, parts, p);
        EXPECT_EQ(b.offset, std::min(next, count));
        next = b.offset + b.count;
        EXPECT_LE(b.count, block(count, parts, 0).count);
      }
      EXPECT_EQ(next, count) << count << " / " << parts;
    }
}

// transport.lane_share: the even share is block(count, 2, lane) exactly (the split of every
// earlier job), any share covers the buffer in two ranges in order, and lane_sum_reference
// sums the ring's part in ring order and the rest in the reversed ring's.
TEST(RingOrder, LaneBlocksSplitByShareAndTheEvenShareIsTheOldHalving) {
  for (std::size_t count : {0u, 1u, 2u, 5u, 9u, 1001u}) {
    for (int lane : {0, 1}) {
      EXPECT_EQ(lane_block(count, 0.5, lane).offset, block(count, 2, lane).offset) << count;
      EXPECT_EQ(lane_block(count, 0.5, lane).count, block(count, 2, lane).count) << count;
    }
    for (double share : {0.01, 0.2, 0.5, 0.73, 0.99}) {
      const Range a = lane_block(count, share, 0), b = lane_block(count, share, 1);
      EXPECT_EQ(a.offset, 0u);
      EXPECT_EQ(b.offset, a.count);
      EXPECT_EQ(a.count + b.count, count);
      EXPECT_EQ(a.count, static_cast<std::size_t>(std::ceil(double(count) * share)));
    }
  }
  const std::size_t n = 100;
  std::vector<std::vector<float>> in(4, std::vector<float>(n));
  for (std::size_t s = 0; s < in.size(); ++s)
    for (std::size_t i = 0; i < n; ++i)
      in[s][i] = std::ldexp(float(i % 7) + 0.1f * float(s), -int(s));
  std::vector<std::span<const float>> views(in.begin(), in.end());
  std::vector<float> got(n), want(n);
  lane_sum_reference(views, got, 2, 0.8);
  // Elements [0, 80) are one ring all-reduce of their own, [80, 100) one on the reversed ring.
  std::vector<std::span<const float>> head(in.size()), tail(in.size());
  for (int s = 0; s < 4; ++s) {
    head[std::size_t(s)] = views[std::size_t(s)].first(80);
    tail[std::size_t(reversed_rank(s, 4))] = views[std::size_t(s)].subspan(80);
  }
  ring_sum_reference(head, std::span<float>(want).first(80));
  ring_sum_reference(tail, std::span<float>(want).subspan(80));
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
}

TEST(ChunkHeaders, MismatchedStepIsAnErrorNamingBothSteps) {
  CollectiveOptions options;
  options.chunk_headers = true;
  options.deadline = 5s;
  options.deadline = 2s;
  options.peer_names = {"west/0", "east/0", "north/0"};
  std::vector<std::string> errors(3);
  try {
    run_ranks(3, options, [&](Collective& c, int r) {
      c.set_label({r == 1 ? 11 : 10, 2, 0});
      std::vector<float> data(100, 1.0f);
      try {
        c.all_reduce_sum(data);
      } catch (const std::exception& e) {
        errors[std::size_t(r)] = e.what();
        throw;
      }
    });
    FAIL() << "a step mismatch went unnoticed";
  } catch (const PeerFailure&) {
  } catch (const TimeoutError&) {
  }
  // Rank 1 hears step 10 from west/0; rank 2 hears step 11 from east/0 unless rank 1's abort
  // cancelled that send first. Either way a receiver names the disagreement and its sender.
  const bool at1 = errors[1].find("step 10 (expected 11)") != std::string::npos &&
                   errors[1].find("west/0") != std::string::npos;
  const bool at2 = errors[2].find("step 11 (expected 10)") != std::string::npos &&
                   errors[2].find("east/0") != std::string::npos;
  EXPECT_TRUE(at1 || at2) << "rank 1: " << errors[1] << "\nrank 2: " << errors[2];
  EXPECT_NE((at1 ? errors[1] : errors[2]).find("nothing was averaged in"), std::string::npos);
}

TEST(ChunkHeaders, MismatchedEpochIsAnError) {
  std::vector<std::string> errors(2);
  InMemoryAddressBook book;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        CollectiveOptions options;
        options.chunk_headers = true;
        options.deadline = 5s;
        options.epoch = r == 0 ? 1 : 2;
        auto c = make_ucx_collective(r, 2, book, options,
                                     test_support::ucx_options(test_support::Backend::kUcxTcp));
        std::vector<float> data(10, 1.0f);
        c->all_reduce_sum(data);
      } catch (const std::exception& e) {
        errors[std::size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_NE(errors[0].find("epoch 2 (expected 1)"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("epoch 1 (expected 2)"), std::string::npos) << errors[1];
}

TEST(ChunkHeaders, CheckNamesEveryDisagreementAndCatchesCorruption) {
  std::vector<float> payload = random_floats(64, 7);
  const std::span<const std::byte> bytes = std::as_bytes(std::span<const float>(payload));
  ChunkHeader want;
  want.epoch = 3;
  want.step = 120;
  want.state = 1;
  want.shard = 2;
  want.length = static_cast<std::uint32_t>(bytes.size());
  want.offset = 4096;
  ChunkHeader got = want;
  got.crc = payload_crc(bytes);
  EXPECT_EQ(check_chunk(want, got, bytes), "");

  ChunkHeader shifted = got;
  shifted.offset = 8192;
  shifted.shard = 1;
  const std::string msg = check_chunk(want, shifted, bytes);
  EXPECT_NE(msg.find("shard 1 (expected 2)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 8192 (expected 4096)"), std::string::npos) << msg;

  std::vector<float> corrupted = payload;
  std::uint32_t word;
  std::memcpy(&word, &corrupted[17], 4);
  word ^= 1u << 9;  // one flipped bit
  std::memcpy(&corrupted[17], &word, 4);
  const std::string crc = check_chunk(want, got, std::as_bytes(std::span<const float>(corrupted)));
  EXPECT_NE(crc.find("CRC32C mismatch"), std::string::npos) << crc;
  EXPECT_NE(crc.find("step 120 state 1 shard 2"), std::string::npos) << crc;
}

}  // namespace
}  // namespace desloc::transport
