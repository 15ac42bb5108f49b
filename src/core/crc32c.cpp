// CRC32C (Castagnoli), slice-by-1 table. Hardware crc32 can replace it if it ever shows
// up in a profile; at checkpoint sizes it runs at several GB/s already.
#include <array>

#include "desloc/core/hash.hpp"

namespace desloc {
namespace {
constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (0x82F63B78u ^ (c >> 1)) : (c >> 1);
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = make_table();
}  // namespace

std::uint32_t crc32c(std::span<const std::uint8_t> bytes, std::uint32_t seed) {
  std::uint32_t c = ~seed;
  for (std::uint8_t b : bytes) c = kTable[(c ^ b) & 0xff] ^ (c >> 8);
  return ~c;
}

}  // namespace desloc
