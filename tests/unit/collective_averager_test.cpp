// The networked averager (CollectiveAverager over UCX, ranks as threads on tcp loopback)
// against the in-process VirtualAverager: the same means for closed-form inputs, and traffic
// equal to what the collective sent (2(n-1)/n of the payload for the ring).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/ucx_collective.hpp"
#include "test_support.hpp"

using namespace desloc;
using namespace std::chrono_literals;
using test_support::Watchdog;

namespace {

// Replica w, element i holds i + w (+ 10 * state): the mean is exact in float.
std::vector<float> replica(int w, std::size_t n, int state) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(i) + float(w) + 10.0f * float(state);
  return v;
}

}  // namespace

class CollectiveAveragerTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveAveragerTest, MatchesTheVirtualAveragerOverUcx) {
  const int M = GetParam();
  constexpr std::size_t kN = 10'007;  // unaligned, several chunks at 8 KiB
  const optim::StateKind kinds[] = {optim::StateKind::kX, optim::StateKind::kU,
                                    optim::StateKind::kV};

  // Reference: M replicas in one process.
  std::vector<std::vector<std::vector<float>>> expect(3);
  sync::VirtualAverager virt(M);
  for (int s = 0; s < 3; ++s) {
    for (int w = 0; w < M; ++w) expect[s].push_back(replica(w, kN, s));
    std::vector<std::span<float>> views(expect[s].begin(), expect[s].end());
    virt.average(kinds[s], views);
  }

  Watchdog watchdog(60s);
  transport::InMemoryAddressBook book;
  transport::CollectiveOptions options;
  options.deadline = 20s;
  options.chunk_bytes = 8 << 10;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(M));
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(M));
  std::vector<sync::Traffic> traffic(static_cast<std::size_t>(M));
  std::vector<std::thread> ranks;
  for (int r = 0; r < M; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto group = transport::make_ucx_collective(r, M, book, options);
        sync::CollectiveAverager avg(*group);
        EXPECT_EQ(avg.sites(), M);
        for (int s = 0; s < 3; ++s) {
          std::vector<float> mine = replica(r, kN, s);
          std::span<float> one(mine);
          avg.average(kinds[s], std::span<const std::span<float>>(&one, 1));
          got[r].push_back(std::move(mine));
        }
        traffic[r] = avg.traffic(0);
        EXPECT_THROW(avg.traffic(1), Error);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);

  for (int r = 0; r < M; ++r) {
    for (int s = 0; s < 3; ++s)
      ASSERT_EQ(got[r][s], expect[s][r]) << "rank " << r << " state " << s;
    const std::uint64_t payload = M > 1 ? kN * sizeof(float) : 0;
    for (int s = 0; s < 3; ++s) {
      const auto k = static_cast<std::size_t>(kinds[s]);
      EXPECT_EQ(traffic[r].payload[k], payload);
      // The ring sends 2(M-1)/M of the payload; chunking rounds each step to whole floats.
      const double ideal = double(payload) * 2.0 * (M - 1) / M;
      EXPECT_NEAR(double(traffic[r].wire[k]), ideal, 2.0 * 2 * M * sizeof(float)) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectiveAveragerTest, ::testing::Values(1, 2, 3, 5));

TEST(CollectiveAverager, RefusesSeveralLocalReplicas) {
  transport::InMemoryAddressBook book;
  auto group = transport::make_ucx_collective(0, 1, book);
  sync::CollectiveAverager avg(*group);
  std::vector<float> a(3), b(3);
  std::vector<std::span<float>> two{a, b};
  EXPECT_THROW(avg.average(optim::StateKind::kX, two), Error);
}

// S sites x R ranks as threads, each with its site group and its WAN group (the two-phase
// open/connect a `desloc worker` uses): the sharded averager equals VirtualAverager in ring
// order bit for bit, on random (not closed-form) inputs, for shards that are empty, tiny and
// unaligned; traffic splits into WAN and intra-site bytes. With two lanes, `share` of each
// shard goes round the ring (transport.lane_share) and the lanes' bytes split alike. Weighted
// (sites that train on unequal tokens, sync.weights): each site's shard scaled by its factor
// before the ring, in both.
class ShardedAveragerTest
    : public ::testing::TestWithParam<std::tuple<int, int, int, double, bool>> {};

// Unequal sites' weights: tokens per step of sites of 3 x 8, 1 x 2, 2 x 4, ... sequences.
std::vector<double> unequal_weights(int sites) {
  const std::vector<double> w{24, 2, 8, 5, 7};
  return {w.begin(), w.begin() + sites};
}

TEST_P(ShardedAveragerTest, MatchesTheRingOrderedVirtualAveragerBitForBit) {
  const auto [S, R, L, share, weighted] = GetParam();
  const bool two_lanes = transport::effective_lanes(L, S) == 2;
  Watchdog watchdog(60s);
  for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{1003}}) {
    auto value = [&](int site, std::size_t i) {
      const auto h = static_cast<std::uint32_t>((i * 2654435761u) ^ (unsigned(site) * 40503u));
      return std::ldexp(static_cast<float>(h % 100003) - 50001.0f, -int(h % 23));
    };
    std::vector<std::vector<float>> expect(static_cast<std::size_t>(S), std::vector<float>(n));
    for (int s = 0; s < S; ++s)
      for (std::size_t i = 0; i < n; ++i) expect[std::size_t(s)][i] = value(s, i);
    std::vector<std::span<float>> views(expect.begin(), expect.end());
    sync::VirtualAverager ring(S, sync::SumOrder::kRing, R, L, share);
    if (weighted) ring.set_weights(unequal_weights(S));
    ring.average(optim::StateKind::kU, views);
    if (weighted) {  // the token-weighted mean, and not the plain one
      const std::vector<double> w = unequal_weights(S);
      double total = 0.0;
      for (double x : w) total += x;
      for (std::size_t i = 0; i < n; ++i) {
        double mean = 0.0, magnitude = 0.0;  // float sums err relative to the terms
        for (int s = 0; s < S; ++s) {
          mean += w[std::size_t(s)] * double(value(s, i));
          magnitude += w[std::size_t(s)] * std::abs(double(value(s, i)));
        }
        ASSERT_NEAR(expect[0][i], mean / total, 1e-6 * magnitude / total) << i;
      }
    }

    test_support::WorldOptions world;
    world.collective.deadline = 20s;
    world.collective.chunk_bytes = 64;
    world.two_lanes = two_lanes;
    std::vector<std::vector<float>> got(static_cast<std::size_t>(S * R));
    std::vector<sync::Traffic> traffic(static_cast<std::size_t>(S * R));
    std::vector<transport::RankReport> reports(static_cast<std::size_t>(S * R));
    test_support::run_world(S, R, world, [&](int s, int r, test_support::Groups& g) {
      const auto me = static_cast<std::size_t>(s * R + r);
      sync::CollectiveAverager avg(*g.wan, g.site.get(), g.reverse.get(), share);
      if (weighted) avg.set_weights(unequal_weights(S));
      sync::SyncMeter meter;
      avg.set_sync_meter(&meter);
      EXPECT_EQ(avg.sites(), S);
      std::vector<float> mine(n);
      for (std::size_t i = 0; i < n; ++i) mine[i] = value(s, i);
      std::span<float> one(mine);
      avg.begin_step(7);
      avg.average(optim::StateKind::kU, std::span<const std::span<float>>(&one, 1));
      got[me] = std::move(mine);
      traffic[me] = avg.traffic(0);
      meter.fill(reports[me]);
    });
    const auto k = static_cast<std::size_t>(optim::StateKind::kU);
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < R; ++r) {
        const auto me = static_cast<std::size_t>(s * R + r);
        ASSERT_EQ(0, std::memcmp(got[me].data(), expect[std::size_t(s)].data(), n * sizeof(float)))
            << "site " << s << " rank " << r << " n " << n;
        EXPECT_EQ(traffic[me].payload[k], n * sizeof(float));
        // This rank's shard crossed the WAN ring; the site's all-gather sent blocks.
        const std::size_t shard = transport::block(n, R, r).count * sizeof(float);
        EXPECT_LE(traffic[me].wire[k], 2 * shard);
        if (R > 1) {
          EXPECT_EQ(traffic[me].site_wire[k],
                    (R - 1) * transport::block(n, R, 0).count * sizeof(float));
        }
        // The lanes carry the shard in the share asked for (chunk headers and rounding aside).
        const double lane0 = double(reports[me].lanes[0].bytes_sent),
                     lane1 = double(reports[me].lanes[1].bytes_sent);
        if (two_lanes && n > 1000) {
          EXPECT_NEAR(lane0 / (lane0 + lane1), share, 0.05) << "site " << s << " rank " << r;
        }
        if (!two_lanes) {
          EXPECT_EQ(lane1, 0.0);
        }
      }
  }
}

INSTANTIATE_TEST_SUITE_P(
    SitesByRanksByLanes, ShardedAveragerTest,
    ::testing::Values(std::make_tuple(2, 1, 1, 0.5, false), std::make_tuple(3, 1, 1, 0.5, false),
                      std::make_tuple(2, 2, 1, 0.5, false), std::make_tuple(3, 2, 1, 0.5, false),
                      std::make_tuple(2, 3, 1, 0.5, false), std::make_tuple(3, 1, 2, 0.5, false),
                      std::make_tuple(4, 2, 2, 0.5, false), std::make_tuple(5, 1, 2, 0.5, false),
                      std::make_tuple(3, 2, 2, 0.75, false), std::make_tuple(4, 1, 2, 0.2, false),
                      std::make_tuple(2, 1, 1, 0.5, true), std::make_tuple(3, 2, 2, 0.5, true),
                      std::make_tuple(5, 1, 2, 0.5, true)),
    [](const auto& info) {
      const double share = std::get<3>(info.param);
      return std::to_string(std::get<0>(info.param)) + "x" +
             std::to_string(std::get<1>(info.param)) + "_lanes" +
             std::to_string(std::get<2>(info.param)) +
             (share == 0.5 ? std::string() : "_share" + std::to_string(int(share * 100))) +
             (std::get<4>(info.param) ? "_weighted" : "");
    });

// Sites of unequal rank counts (sync::ShardMap): each rank runs one ring per segment it owns,
// in segment order, and its site all-gathers the ranks' unequal ranges. The networked average
// equals the VirtualAverager over the same map bit for bit, for plain and int4 + error feedback
// averages, one and two lanes, token weights, and a site the payload guard leaves out (its
// verdict agreed on every ring). Two rounds, so the second carries the first's feedback.
struct UnequalCase {
  std::vector<int> ranks;  // per site, in ring order
  int lanes = 1;
  bool weighted = false;
  bool int4 = false;
  bool bad_site = false;  // the last site sends 1000x the others (left out from 3 sites)
};

class UnequalRankCountsTest : public ::testing::TestWithParam<UnequalCase> {};

TEST_P(UnequalRankCountsTest, MatchesTheVirtualAveragerOverTheSameShardMap) {
  const UnequalCase c = GetParam();
  const int S = static_cast<int>(c.ranks.size());
  const sync::ShardMap map(c.ranks);
  Watchdog watchdog(90s);
  constexpr int kRounds = 2;
  sync::PayloadGuard guard;
  guard.site_names = {"east", "west", "north", "south"};
  auto codec_views = [](std::vector<float>& ref, std::vector<std::vector<float>>* ef) {
    sync::CodecViews v;
    v.codec = sync::Codec::kInt4;
    v.block = 16;
    v.reference = ref;
    if (ef != nullptr) v.feedback.assign(ef->begin(), ef->end());
    return v;
  };
  for (const std::size_t n : {std::size_t{5}, std::size_t{2053}}) {
    auto value = [&](int site, std::size_t i, int round) {
      const auto h = static_cast<std::uint32_t>((i * 2654435761u) ^ (unsigned(site) * 40503u));
      const float v = std::ldexp(static_cast<float>(h % 100003) - 50001.0f, -int(h % 23) - 8) +
                      0.01f * float(round);
      return c.bad_site && site == S - 1 ? v * 1000.0f : v;
    };
    // The reference: every site's replica in one process.
    const auto Ss = static_cast<std::size_t>(S);
    std::vector<std::vector<float>> expect(Ss, std::vector<float>(n));
    std::vector<float> ref(n, 0.0f);
    std::vector<std::vector<float>> ef(Ss, std::vector<float>(n, 0.0f));
    sync::VirtualAverager virt(S, sync::SumOrder::kRing, map, c.lanes, 0.5);
    if (c.weighted) virt.set_weights(unequal_weights(S));
    virt.set_payload_guard(guard);
    for (int round = 0; round < kRounds; ++round) {
      for (int s = 0; s < S; ++s)
        for (std::size_t i = 0; i < n; ++i) expect[std::size_t(s)][i] = value(s, i, round);
      virt.begin_step(3 + round);
      if (c.int4) virt.set_codec(optim::StateKind::kU, codec_views(ref, &ef));
      std::vector<std::span<float>> views(expect.begin(), expect.end());
      virt.average(optim::StateKind::kU, views);
    }
    const bool left_out = c.bad_site && S >= 3 && n > 1024;
    ASSERT_EQ(virt.rejections().size(), left_out ? std::size_t{kRounds} : 0u) << "n " << n;

    test_support::WorldOptions world;
    world.collective.deadline = 20s;
    world.collective.chunk_bytes = 256;
    world.two_lanes = transport::effective_lanes(c.lanes, S) == 2;
    struct Got {
      std::vector<float> state, ref, ef;
      std::size_t rejections = 0;
    };
    std::vector<std::vector<Got>> got(Ss);
    for (int s = 0; s < S; ++s) got[std::size_t(s)].resize(std::size_t(c.ranks[std::size_t(s)]));
    test_support::run_world(c.ranks, world, [&](int s, int r, test_support::Groups& g) {
      sync::CollectiveAverager avg(g.wan_rings(), map, g.site.get(), 0.5);
      if (c.weighted) avg.set_weights(unequal_weights(S));
      avg.set_payload_guard(guard);
      EXPECT_EQ(avg.sites(), S);
      std::vector<float> mine(n), my_ref(n, 0.0f);
      std::vector<std::vector<float>> my_ef(1, std::vector<float>(n, 0.0f));
      for (int round = 0; round < kRounds; ++round) {
        for (std::size_t i = 0; i < n; ++i) mine[i] = value(s, i, round);
        std::span<float> one(mine);
        avg.begin_step(3 + round);
        if (c.int4) avg.set_codec(optim::StateKind::kU, codec_views(my_ref, &my_ef));
        avg.average(optim::StateKind::kU, std::span<const std::span<float>>(&one, 1));
      }
      got[std::size_t(s)][std::size_t(r)] = {mine, my_ref, my_ef[0], avg.rejections().size()};
    });
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < c.ranks[std::size_t(s)]; ++r) {
        const Got& have = got[std::size_t(s)][std::size_t(r)];
        const std::string where =
            "site " + std::to_string(s) + " rank " + std::to_string(r) + " n " + std::to_string(n);
        ASSERT_EQ(0,
                  std::memcmp(have.state.data(), expect[std::size_t(s)].data(), n * sizeof(float)))
            << where;
        EXPECT_EQ(have.rejections, virt.rejections().size()) << where;
        if (!c.int4) continue;
        EXPECT_EQ(0, std::memcmp(have.ref.data(), ref.data(), n * sizeof(float))) << where;
        // The feedback of the range this rank owns (the rest stays the site's other ranks').
        const transport::Range b = map.owned(n, c.ranks[std::size_t(s)], r);
        EXPECT_EQ(0, std::memcmp(have.ef.data() + b.offset, ef[std::size_t(s)].data() + b.offset,
                                 b.count * sizeof(float)))
            << where;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Sites, UnequalRankCountsTest,
                         ::testing::Values(UnequalCase{{1, 2, 3}, 1, false, false, false},
                                           UnequalCase{{1, 2, 3}, 2, true, false, false},
                                           UnequalCase{{3, 1, 2}, 2, true, true, false},
                                           UnequalCase{{2, 4}, 1, true, true, false},
                                           UnequalCase{{1, 2, 3}, 2, true, false, true},
                                           UnequalCase{{2, 1, 3, 1}, 2, true, true, true}),
                         [](const auto& info) {
                           const UnequalCase& c = info.param;
                           std::string name;
                           for (const int r : c.ranks) name += std::to_string(r);
                           name += "_lanes" + std::to_string(c.lanes);
                           if (c.weighted) name += "_weighted";
                           if (c.int4) name += "_int4ef";
                           if (c.bad_site) name += "_badsite";
                           return name;
                         });
