// CRC32C against published check values (RFC 3720 B.4 and the "123456789" check), for both
// the hardware and the table path (whichever this build compiled), including unaligned tails.
#include <gtest/gtest.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "desloc/core/hash.hpp"

using desloc::crc32c;

namespace {
std::uint32_t crc_of(std::string_view s) {
  return crc32c({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
}
// Bit-at-a-time reference, independent of either fast path.
std::uint32_t crc_reference(const std::vector<std::uint8_t>& bytes) {
  std::uint32_t c = ~0u;
  for (std::uint8_t b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (0x82F63B78u ^ (c >> 1)) : (c >> 1);
  }
  return ~c;
}
}  // namespace

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  EXPECT_EQ(crc_of(""), 0u);
  EXPECT_EQ(crc32c(std::vector<std::uint8_t>(32, 0)), 0x8A9136AAu);     // RFC 3720 B.4
  EXPECT_EQ(crc32c(std::vector<std::uint8_t>(32, 0xff)), 0x62A8AB43u);  // RFC 3720 B.4
}

TEST(Crc32c, MatchesTheBitwiseReferenceAtEveryLengthAndSeedChains) {
  std::vector<std::uint8_t> data(100);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 37 + 11);
  for (std::size_t n = 0; n <= data.size(); ++n) {
    std::vector<std::uint8_t> prefix(data.begin(), data.begin() + static_cast<long>(n));
    ASSERT_EQ(crc32c(prefix), crc_reference(prefix)) << "length " << n;
  }
  // crc(a ++ b) == crc(b, seed = crc(a))
  const std::span<const std::uint8_t> all(data);
  EXPECT_EQ(crc32c(all.subspan(37), crc32c(all.first(37))), crc32c(all));
}
