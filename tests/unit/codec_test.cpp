// The wide-area payload codecs: sizes, round-trip error bounds, exactness where promised,
// non-finite values, and bad sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/sync/codec.hpp"

using namespace desloc;
using sync::Codec;

namespace {
std::vector<float> roundtrip(Codec c, const std::vector<float>& x, std::size_t block = 64) {
  std::vector<std::byte> buf(sync::encoded_bytes(c, x.size(), block));
  sync::encode(c, x, buf, block);
  std::vector<float> y(x.size());
  sync::decode(c, buf, y, block);
  return y;
}

std::vector<float> gaussian(std::size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = d(gen);
  return x;
}
}  // namespace

TEST(Codec, NamesParseBothWays) {
  for (const Codec c : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kInt2})
    EXPECT_EQ(sync::parse_codec(sync::to_string(c)), c);
  EXPECT_FALSE(sync::parse_codec("fp8").has_value());
}

TEST(Codec, SizesCountScalesAndPackedIntegers) {
  EXPECT_EQ(sync::encoded_bytes(Codec::kFp32, 1000), 4000u);
  EXPECT_EQ(sync::encoded_bytes(Codec::kBf16, 1000), 2000u);
  // 8 blocks of the default 128 (the last of 104): 8 float scales, then the integers.
  EXPECT_EQ(sync::encoded_bytes(Codec::kInt8, 1000), 8u * 4 + 1000);
  EXPECT_EQ(sync::encoded_bytes(Codec::kInt4, 1000), 8u * 4 + 500);
  EXPECT_EQ(sync::encoded_bytes(Codec::kInt2, 1001), 8u * 4 + 251);
  EXPECT_EQ(sync::encoded_bytes(Codec::kInt8, 1000, 64), 16u * 4 + 1000);
  EXPECT_EQ(sync::encoded_bytes(Codec::kInt8, 0), 0u);
}

// fp32 is exact; bf16 keeps 8 significant bits (relative error <= 2^-8, rounded to nearest);
// int8 and int4 err by at most half a step of their block's scale, max|x| / q_max; int2 by
// half its step (the block's RMS) inside +-2 RMS, and by the clip beyond.
TEST(Codec, RoundTripErrorsStayWithinTheQuantisationStep) {
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{1000}, std::size_t{4099}}) {
    const std::vector<float> x = gaussian(n, static_cast<unsigned>(n));
    EXPECT_EQ(roundtrip(Codec::kFp32, x), x);
    const std::vector<float> h = roundtrip(Codec::kBf16, x);
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_LE(std::abs(h[i] - x[i]), std::abs(x[i]) * std::ldexp(1.0f, -8)) << i;
    for (const Codec c : {Codec::kInt8, Codec::kInt4, Codec::kInt2})
      for (const std::size_t block : {std::size_t{4}, std::size_t{64}, std::size_t{256}}) {
        const std::vector<float> y = roundtrip(c, x, block);
        for (std::size_t b = 0; b * block < n; ++b) {
          const std::size_t lo = b * block, hi = std::min(n, (b + 1) * block);
          double amax = 0, squares = 0;
          for (std::size_t i = lo; i < hi; ++i) {
            amax = std::max(amax, double(std::abs(x[i])));
            squares += double(x[i]) * double(x[i]);
          }
          // int2: levels +-s/2, +-3s/2 at s = RMS, so half a step inside +-2s, clipped beyond.
          const double rms = std::sqrt(squares / double(hi - lo));
          for (std::size_t i = lo; i < hi; ++i) {
            const double bound = c == Codec::kInt2 ? std::max(0.5 * rms, std::abs(x[i]) - 1.5 * rms)
                                                   : 0.5 * amax / sync::codec_qmax(c);
            ASSERT_LE(std::abs(y[i] - x[i]), bound * (1 + 1e-5) + 1e-30)
                << sync::to_string(c) << " block " << block << " i " << i;
          }
        }
      }
  }
}

// int2 places four levels at +-s/2 and +-3s/2 of the block's RMS s: {3, 1, -1, -1} has
// s = sqrt(3), so 3 / s > 1 takes the outer level and +-1 / s in (-1, 1) the inner ones.
TEST(Codec, Int2HasFourLevelsAtTheBlocksRms) {
  const std::vector<float> x = {3.0f, 1.0f, -1.0f, -1.0f};
  const float s = std::sqrt(3.0f);
  EXPECT_EQ(roundtrip(Codec::kInt2, x, 4),
            (std::vector<float>{1.5f * s, 0.5f * s, -0.5f * s, -0.5f * s}));
  EXPECT_EQ(roundtrip(Codec::kInt2, std::vector<float>(8, 0.0f), 4), std::vector<float>(8, 0.0f));
}

// Integers on the grid survive exactly (a block's max sets the scale), zeros stay zero, and
// the integer codecs are symmetric: -x decodes to the negation of x's decode.
TEST(Codec, GridValuesZerosAndSignsAreExact) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[std::size_t(i)] = float((i % 15) - 7);  // -7..7, max |7|
  EXPECT_EQ(roundtrip(Codec::kInt4, x), x);
  EXPECT_EQ(roundtrip(Codec::kInt8, std::vector<float>(100, 0.0f)), std::vector<float>(100, 0.0f));
  const std::vector<float> g = gaussian(300, 7);
  std::vector<float> neg(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) neg[i] = -g[i];
  for (const Codec c : {Codec::kInt8, Codec::kInt4, Codec::kInt2}) {
    const auto a = roundtrip(c, g), b = roundtrip(c, neg);
    for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(a[i], -b[i]) << sync::to_string(c);
  }
}

// A NaN or an infinity poisons its block (decoded as NaN) and no other: the payload guard
// judges the decoded values and must see it.
TEST(Codec, NonFiniteValuesPoisonTheirBlockOnly) {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = gaussian(256, 3);
    x[70] = bad;  // block 1 of 64
    for (const Codec c : {Codec::kInt8, Codec::kInt4, Codec::kInt2}) {
      const auto y = roundtrip(c, x);
      for (std::size_t i = 0; i < 256; ++i)
        ASSERT_EQ(std::isnan(y[i]), i >= 64 && i < 128) << sync::to_string(c) << " " << i;
    }
    const auto h = roundtrip(Codec::kBf16, x);
    EXPECT_EQ(std::isnan(h[70]), std::isnan(bad));
    EXPECT_EQ(std::isinf(h[70]), std::isinf(bad));
  }
}

TEST(Codec, BadSizesAndBlocksAreRefused) {
  std::vector<float> x(10);
  std::vector<std::byte> small(5);
  EXPECT_THROW(sync::encode(Codec::kInt8, x, small), Error);
  EXPECT_THROW(sync::decode(Codec::kBf16, small, x), Error);
  std::vector<std::byte> buf(sync::encoded_bytes(Codec::kInt8, 10, 8));
  try {
    sync::encode(Codec::kInt8, x, buf, 6);
    ADD_FAILURE() << "a block of 6";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("a block of 6 elements; it must be a positive multiple of 4"),
              std::string::npos)
        << e.message();
  }
}
