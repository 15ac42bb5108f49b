// Compressed averages (compression.hpp): the in-process averager against hand-computed means,
// error feedback, the payload guard and v's clamp; the networked averager (UCX loopback,
// sites x ranks as threads) against the in-process one bit for bit, references and feedback
// included, with the wire bytes of an all-gather of encoded shards.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "desloc/sync/averager.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/sync/compression.hpp"
#include "desloc/sync/sync_policy.hpp"
#include "desloc/transport/ring_order.hpp"
#include "test_support.hpp"

using namespace desloc;
using namespace std::chrono_literals;
using optim::StateKind;
using sync::Codec;
using sync::CodecViews;

namespace {

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& v) {
  return {v.begin(), v.end()};
}

CodecViews views_of(Codec c, std::vector<float>& ref, std::vector<std::vector<float>>* ef,
                    std::size_t block = 8) {
  CodecViews v;
  v.codec = c;
  v.block = block;
  v.reference = ref;
  if (ef != nullptr) v.feedback = spans(*ef);
  return v;
}

// A value that needs all of a float's mantissa, spread over magnitudes.
float messy(int site, std::size_t i) {
  const auto h = static_cast<std::uint32_t>((i * 2654435761u) ^ (unsigned(site + 1) * 40503u));
  return std::ldexp(static_cast<float>(h % 100003) - 50001.0f, -int(h % 7) - 14);
}

}  // namespace

// bf16 carries these differences exactly, so the mean is exact: r + (1 + 2 + 6) / 3 / 4.
TEST(Compression, AnAverageIsTheReferencePlusTheMeanOfTheDecodedDifferences) {
  std::vector<float> ref(5, 1.0f);
  std::vector<std::vector<float>> x = {std::vector<float>(5, 1.25f), std::vector<float>(5, 1.5f),
                                       std::vector<float>(5, 2.5f)};
  sync::VirtualAverager avg(3, sync::SumOrder::kRing);
  avg.set_codec(StateKind::kX, views_of(Codec::kBf16, ref, nullptr));
  avg.average(StateKind::kX, spans(x));
  for (const auto& r : x) EXPECT_EQ(r, std::vector<float>(5, 1.75f));
  EXPECT_EQ(ref, std::vector<float>(5, 1.75f));  // the new shared reference
  const auto k = static_cast<std::size_t>(StateKind::kX);
  EXPECT_EQ(avg.traffic(0).payload[k], 5 * sizeof(float));
  // A ring of encoded segments (2, 2 and 1 values: 4 bytes each, padded): the reduce-scatter
  // and the all-gather each send 2 of them.
  EXPECT_EQ(avg.traffic(0).wire[k], 2 * 2 * 4u);
  // The setting is consumed: the next average is fp32 and leaves the reference alone.
  x[0].assign(5, 3.0f);
  avg.average(StateKind::kX, spans(x));
  EXPECT_EQ(x[1], std::vector<float>(5, (3.0f + 1.75f + 1.75f) / 3.0f));
  EXPECT_EQ(ref, std::vector<float>(5, 1.75f));
}

// Two sites by hand, with the codec's own functions: each site's difference (with the feedback
// it kept) encoded; segment 0 starts at site 0 and site 1 decodes it, adds its own decoded
// segment and re-encodes the sum; segment 1 the other way round. The feedback keeps what each
// encoding dropped, the site's own and the sum it re-encoded; the mean is the decoded sums.
TEST(Compression, ErrorFeedbackKeepsWhatEveryEncodingDropped) {
  constexpr std::size_t n = 37;  // segments [0, 19) and [19, 37)
  constexpr int M = 2;
  constexpr std::size_t kSplit = 19;
  std::vector<float> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = messy(9, i);
  std::vector<std::vector<float>> ef(M, std::vector<float>(n, 0.0f));
  for (std::size_t i = 0; i < n; ++i) ef[1][i] = 0.125f * messy(7, i);  // left from before
  std::vector<std::vector<float>> x(M, std::vector<float>(n));
  for (int w = 0; w < M; ++w)
    for (std::size_t i = 0; i < n; ++i) x[std::size_t(w)][i] = ref[i] + messy(w, i);

  auto round_trip = [](std::span<const float> v, std::span<float> out) {
    std::vector<std::byte> enc(sync::encoded_bytes(Codec::kInt2, v.size(), 8));
    sync::encode(Codec::kInt2, v, enc, 8);
    sync::decode(Codec::kInt2, enc, out, 8);
  };
  std::vector<float> d[M], own[M], want_ef[M];
  for (int w = 0; w < M; ++w) {
    d[w].resize(n);
    own[w].resize(n);
    for (std::size_t i = 0; i < n; ++i)
      d[w][i] = (x[std::size_t(w)][i] - ref[i]) + ef[std::size_t(w)][i];
    round_trip(std::span<const float>(d[w]).first(kSplit), std::span<float>(own[w]).first(kSplit));
    round_trip(std::span<const float>(d[w]).subspan(kSplit),
               std::span<float>(own[w]).subspan(kSplit));
    want_ef[w].resize(n);
    for (std::size_t i = 0; i < n; ++i) want_ef[w][i] = d[w][i] - own[w][i];
  }
  std::vector<float> want_ref = ref, sum(n), dec(n);
  for (const auto& [lo, hi, relay] :
       {std::tuple{std::size_t{0}, kSplit, 1}, std::tuple{kSplit, n, 0}}) {
    for (std::size_t i = lo; i < hi; ++i) sum[i] = own[1 - relay][i] + own[relay][i];
    round_trip(std::span<const float>(sum).subspan(lo, hi - lo),
               std::span<float>(dec).subspan(lo, hi - lo));
    for (std::size_t i = lo; i < hi; ++i) {
      want_ef[relay][i] += sum[i] - dec[i];
      want_ref[i] = ref[i] + dec[i] / 2.0f;
    }
  }

  sync::VirtualAverager avg(M, sync::SumOrder::kRing);
  avg.set_codec(StateKind::kU, views_of(Codec::kInt2, ref, &ef));
  avg.average(StateKind::kU, spans(x));
  EXPECT_EQ(ref, want_ref);
  for (int w = 0; w < M; ++w) {
    EXPECT_EQ(x[std::size_t(w)], want_ref) << "replica " << w;
    EXPECT_EQ(ef[std::size_t(w)], want_ef[w]) << "replica " << w;
  }
  // int2 drops a lot: the feedback is not zero.
  EXPECT_NE(ef[0], std::vector<float>(n, 0.0f));
}

// A site whose payload is not finite is left out: the others' mean, and its feedback restarts.
TEST(Compression, ARejectedSiteIsLeftOutAndItsFeedbackStartsOver) {
  std::vector<float> ref(8, 0.0f);
  std::vector<std::vector<float>> ef(3, std::vector<float>(8, 0.5f));
  std::vector<std::vector<float>> x = {std::vector<float>(8, 1.0f), std::vector<float>(8, 2.0f),
                                       std::vector<float>(8, 1.0f)};
  x[1][3] = std::numeric_limits<float>::quiet_NaN();
  sync::VirtualAverager avg(3, sync::SumOrder::kRing);
  avg.begin_step(4);
  avg.set_codec(StateKind::kX, views_of(Codec::kBf16, ref, &ef));
  avg.average(StateKind::kX, spans(x));
  ASSERT_EQ(avg.rejections().size(), 1u);
  EXPECT_EQ(avg.rejections()[0].site, 1);
  // (1 + 0.5) from each kept site: bf16 carries 1.5 exactly.
  for (const auto& r : x) EXPECT_EQ(r, std::vector<float>(8, 1.5f));
  EXPECT_EQ(ef[1], std::vector<float>(8, 0.0f));
  EXPECT_EQ(ef[0], std::vector<float>(8, 0.0f));  // bf16 dropped nothing of 1.5
}

// The guard judges what a compressed payload carries once decoded, feedback included: a NaN
// poisons its whole codec block (8 of 16 values), and a site whose state looks like the others'
// but whose feedback is huge sends a payload 1000x theirs, and is left out for it.
TEST(Compression, ThePayloadGuardJudgesTheDecodedPayloads) {
  {
    std::vector<float> ref(16, 0.0f);
    std::vector<std::vector<float>> x(2, std::vector<float>(16, 1.0f));  // segments of 8
    x[1][3] = std::numeric_limits<float>::quiet_NaN();
    sync::VirtualAverager avg(2, sync::SumOrder::kRing);
    avg.set_codec(StateKind::kX, views_of(Codec::kInt8, ref, nullptr, 8));
    avg.average(StateKind::kX, spans(x));
    ASSERT_EQ(avg.rejections().size(), 1u);
    EXPECT_EQ(avg.rejections()[0].reason, "8 of 16 values non-finite (NaN or Inf)");
  }
  constexpr std::size_t n = 2048;  // long enough for the norm test
  std::vector<float> ref(n, 0.0f);
  std::vector<std::vector<float>> x(4, std::vector<float>(n, 1.0f));
  std::vector<std::vector<float>> ef(4, std::vector<float>(n, 0.0f));
  ef[2].assign(n, 1000.0f);
  sync::VirtualAverager avg(4, sync::SumOrder::kRing);
  avg.set_codec(StateKind::kX, views_of(Codec::kInt8, ref, &ef, 64));
  avg.average(StateKind::kX, spans(x));
  ASSERT_EQ(avg.rejections().size(), 1u);
  EXPECT_EQ(avg.rejections()[0].site, 2);
  EXPECT_NE(avg.rejections()[0].reason.find("the median"), std::string::npos);
  for (const auto& r : x) EXPECT_EQ(r, std::vector<float>(n, 1.0f));
  // Without the codec the same states are all alike: nobody is left out.
  std::vector<std::vector<float>> plain(4, std::vector<float>(n, 1.0f));
  sync::VirtualAverager fp32(4, sync::SumOrder::kRing);
  fp32.average(StateKind::kX, spans(plain));
  EXPECT_TRUE(fp32.rejections().empty());
}

// v's mean is clamped at zero: Adam takes its square root. Reference 0.6, v = 0 in a block
// whose scale 7 / 7 = 1 comes from a larger element: int4 rounds -0.6 to -1, so the decoded
// mean would be 0.6 - 1 < 0.
TEST(Compression, TheMeanOfASecondMomentNeverGoesNegative) {
  for (const bool clamp : {false, true}) {
    std::vector<float> ref(4, 0.6f);
    std::vector<std::vector<float>> v = {{0.0f, 7.6f, 0.6f, 0.6f}, {0.0f, 7.6f, 0.6f, 0.6f}};
    CodecViews c = views_of(Codec::kInt4, ref, nullptr, 4);
    c.nonnegative = clamp;
    sync::VirtualAverager avg(2, sync::SumOrder::kRing);
    avg.set_codec(StateKind::kV, c);
    avg.average(StateKind::kV, spans(v));
    if (clamp) {
      EXPECT_EQ(v[0][0], 0.0f);
      EXPECT_EQ(ref[0], 0.0f);
    } else {
      EXPECT_LT(v[0][0], 0.0f);  // what the clamp prevents
    }
    EXPECT_EQ(v[0], v[1]);
  }
}

// In the sqrt domain the sites send sqrt(v) - r and the mean is the square of their mean
// root: v = 1, 4, 9 from a reference of 1 (bf16 carries 0, 1, 2 exactly) gives (1 + 1)^2 = 4
// and the new reference sqrt(4) = 2. A v of 0 in the other lane stays 0.
TEST(Compression, TheSqrtDomainAveragesTheSquareRoots) {
  std::vector<float> ref = {1.0f, 0.0f};
  std::vector<std::vector<float>> v = {{1.0f, 0.0f}, {4.0f, 0.0f}, {9.0f, 0.0f}};
  CodecViews c = views_of(Codec::kBf16, ref, nullptr, 4);
  c.nonnegative = c.sqrt_domain = true;
  sync::VirtualAverager avg(3, sync::SumOrder::kRing);
  avg.set_codec(StateKind::kV, c);
  avg.average(StateKind::kV, spans(v));
  for (const auto& r : v) EXPECT_EQ(r, (std::vector<float>{4.0f, 0.0f}));
  EXPECT_EQ(ref, (std::vector<float>{2.0f, 0.0f}));
  // One site: its own state is the mean, and the reference its square root.
  std::vector<std::vector<float>> one = {{6.25f, 0.0f}};
  sync::VirtualAverager alone(1, sync::SumOrder::kRing);
  alone.set_codec(StateKind::kV, c);
  alone.average(StateKind::kV, spans(one));
  EXPECT_EQ(ref, (std::vector<float>{2.5f, 0.0f}));
  // The config's spelling.
  sync::SyncConfig s;
  s.codec_v = "sqrt-int4";
  EXPECT_TRUE(s.compression().sqrt_v);
  EXPECT_EQ(s.compression().of(StateKind::kV), Codec::kInt4);
  EXPECT_TRUE(sync::CompressionState(s.compression(), 4, 1).views(StateKind::kV, 0, 1).sqrt_domain);
  EXPECT_FALSE(
      sync::CompressionState(s.compression(), 4, 1).views(StateKind::kU, 0, 1).sqrt_domain);
}

// CompressionState hands out the block of a fragment, for the reference and every replica's
// feedback; states without a codec have neither.
TEST(Compression, TheStateHandsOutEachFragmentsBlock) {
  sync::CompressionConfig cfg;
  cfg.codec[static_cast<std::size_t>(StateKind::kU)] = Codec::kInt4;
  cfg.error_feedback = true;
  sync::CompressionState st(cfg, 10, 2);
  EXPECT_TRUE(st.active());
  EXPECT_TRUE(st.reference(StateKind::kX).empty());
  ASSERT_EQ(st.reference(StateKind::kU).size(), 10u);
  const CodecViews v = st.views(StateKind::kU, 1, 3);  // block 1 of 3 of 10: [4, 8)
  EXPECT_EQ(v.codec, Codec::kInt4);
  EXPECT_EQ(v.reference.data(), st.reference(StateKind::kU).data() + 4);
  EXPECT_EQ(v.reference.size(), 4u);
  ASSERT_EQ(v.feedback.size(), 2u);
  EXPECT_EQ(v.feedback[1].data(), st.feedback(StateKind::kU, 1).data() + 4);
  std::vector<float> x0(10, 3.0f);
  st.reset(x0);  // x is not compressed: only u's (zero) reference exists
  EXPECT_EQ(st.reference(StateKind::kU), std::vector<float>(10, 0.0f));
  st.resize(3);
  EXPECT_EQ(st.feedback(StateKind::kU, 2), std::vector<float>(10, 0.0f));
}

// S sites x R ranks over UCX loopback: each rank encodes its shard, the WAN group all-gathers
// them, the site all-gathers the means: equal bit for bit to the in-process averager, and the
// wire carries (S - 1) encoded shards per rank.
// 1003 values: one piece per segment. 2 x 65536 + 1 per rank: segments of more than one
// encoded piece, the shorter ones padded with a piece of nothing.
// Weighted: each site's difference scaled by its weight's factor before it is encoded, its
// feedback holding what the scaled difference dropped.
class CompressedAveragerTest
    : public ::testing::TestWithParam<std::tuple<int, int, std::size_t, bool>> {};

TEST_P(CompressedAveragerTest, EqualsTheInProcessAveragerBitForBit) {
  const auto [S, R, per_rank, weighted] = GetParam();
  // Tokens per step of sites of 3 x 8, 1 x 2 and 2 x 4 sequences.
  std::vector<double> weights;
  if (weighted) weights.assign({24.0, 2.0, 8.0});
  weights.resize(weighted ? std::size_t(S) : 0);
  test_support::Watchdog watchdog(60s);
  const std::size_t n = per_rank * static_cast<std::size_t>(R);
  constexpr std::size_t kBlock = 16;
  // u in int4, and v in int8 on its square root (its reference is sqrt of a positive mean).
  std::vector<float> ref0(n), vref0(n);
  for (std::size_t i = 0; i < n; ++i) {
    ref0[i] = messy(99, i);
    vref0[i] = std::sqrt(std::abs(messy(98, i)));
  }
  auto value = [&](int s, std::size_t i, int round) {
    return ref0[i] + messy(s, i) + (round > 0 ? 0.01f * float(s) : 0.0f);
  };
  auto second = [&](int s, std::size_t i, int round) {
    return vref0[i] * vref0[i] + std::abs(messy(s + 7, i)) * float(round + 1);
  };
  auto u_views = [&](std::vector<float>& r, std::vector<std::vector<float>>* e) {
    return views_of(Codec::kInt4, r, e, kBlock);
  };
  auto v_views = [&](std::vector<float>& r, std::vector<std::vector<float>>* e) {
    CodecViews c = views_of(Codec::kInt8, r, e, kBlock);
    c.nonnegative = c.sqrt_domain = true;
    return c;
  };
  // Two rounds, so the second payload carries the first one's feedback.
  constexpr int kRounds = 2;
  const auto Ss = static_cast<std::size_t>(S);
  std::vector<std::vector<float>> expect(Ss, std::vector<float>(n)), vexpect = expect;
  std::vector<float> ref = ref0, vref = vref0;
  std::vector<std::vector<float>> ef(Ss, std::vector<float>(n, 0.0f)), vef = ef;
  sync::VirtualAverager virt(S, sync::SumOrder::kRing, R, 2);
  virt.set_weights(weights);
  for (int round = 0; round < kRounds; ++round) {
    for (int s = 0; s < S; ++s)
      for (std::size_t i = 0; i < n; ++i) {
        expect[std::size_t(s)][i] = value(s, i, round);
        vexpect[std::size_t(s)][i] = second(s, i, round);
      }
    virt.set_codec(StateKind::kU, u_views(ref, &ef));
    virt.average(StateKind::kU, spans(expect));
    virt.set_codec(StateKind::kV, v_views(vref, &vef));
    virt.average(StateKind::kV, spans(vexpect));
  }

  test_support::WorldOptions world;
  world.collective.deadline = 20s;
  world.collective.chunk_bytes = 64;
  world.two_lanes = S >= 3;
  struct Got {
    std::vector<float> state, ref, ef;
  };
  std::vector<std::array<Got, 2>> got(std::size_t(S * R));  // u, v
  std::vector<sync::Traffic> traffic(got.size());
  test_support::run_world(S, R, world, [&](int s, int r, test_support::Groups& g) {
    const auto me = static_cast<std::size_t>(s * R + r);
    sync::CollectiveAverager avg(*g.wan, g.site.get(), g.reverse.get());
    avg.set_weights(weights);
    std::vector<float> mine(n), my_ref = ref0, vmine(n), my_vref = vref0;
    std::vector<std::vector<float>> my_ef(1, std::vector<float>(n, 0.0f)), my_vef = my_ef;
    for (int round = 0; round < kRounds; ++round) {
      for (std::size_t i = 0; i < n; ++i) {
        mine[i] = value(s, i, round);
        vmine[i] = second(s, i, round);
      }
      std::span<float> one(mine), vone(vmine);
      avg.begin_step(3 + round);
      avg.set_codec(StateKind::kU, u_views(my_ref, &my_ef));
      avg.average(StateKind::kU, std::span<const std::span<float>>(&one, 1));
      avg.set_codec(StateKind::kV, v_views(my_vref, &my_vef));
      avg.average(StateKind::kV, std::span<const std::span<float>>(&vone, 1));
    }
    got[me][0] = {mine, my_ref, my_ef[0]};
    got[me][1] = {vmine, my_vref, my_vef[0]};
    traffic[me] = avg.traffic(0);
  });
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r) {
      const auto me = static_cast<std::size_t>(s * R + r);
      const transport::Range b = transport::block(n, R, r);  // the feedback this rank keeps
      for (const StateKind kind : {StateKind::kU, StateKind::kV}) {
        const bool u = kind == StateKind::kU;
        const Got& have = got[me][u ? 0 : 1];
        const auto& want = (u ? expect : vexpect)[std::size_t(s)];
        const auto& want_ref = u ? ref : vref;
        const auto& want_ef = (u ? ef : vef)[std::size_t(s)];
        const std::string where = "site " + std::to_string(s) + " rank " + std::to_string(r) + " " +
                                  std::string(optim::to_string(kind));
        ASSERT_EQ(0, std::memcmp(have.state.data(), want.data(), n * sizeof(float))) << where;
        EXPECT_EQ(0, std::memcmp(have.ref.data(), want_ref.data(), n * sizeof(float))) << where;
        EXPECT_EQ(0, std::memcmp(have.ef.data() + b.offset, want_ef.data() + b.offset,
                                 b.count * sizeof(float)))
            << where;
        // The reduce-scatter and the all-gather of encoded segments: S - 1 each.
        std::vector<float> none;
        const sync::RingLayout l(u ? u_views(none, nullptr) : v_views(none, nullptr), b.count, S);
        const auto k = static_cast<std::size_t>(kind);
        EXPECT_EQ(traffic[me].wire[k], kRounds * 2 * (S - 1) * l.segment_bytes) << where;
        EXPECT_EQ(traffic[me].payload[k], kRounds * n * sizeof(float)) << where;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    SitesByRanks, CompressedAveragerTest,
    ::testing::Values(std::make_tuple(2, 1, 1003, false), std::make_tuple(3, 1, 1003, false),
                      std::make_tuple(2, 2, 1003, false), std::make_tuple(3, 2, 1003, false),
                      std::make_tuple(2, 1, 131073, false), std::make_tuple(3, 2, 131073, false),
                      std::make_tuple(3, 1, 1003, true), std::make_tuple(3, 2, 131073, true)),
    [](const auto& info) {
      return std::to_string(std::get<0>(info.param)) + "x" +
             std::to_string(std::get<1>(info.param)) + "_n" +
             std::to_string(std::get<2>(info.param)) + (std::get<3>(info.param) ? "_weighted" : "");
    });
