// Checksums: CRC32C for payload integrity (files, later wire chunks) and FNV-1a 64 for
// config identity hashes.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace desloc {

std::uint32_t crc32c(std::span<const std::uint8_t> bytes, std::uint32_t seed = 0);

constexpr std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace desloc
