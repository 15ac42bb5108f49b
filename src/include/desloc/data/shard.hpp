// Token shard files.
// Layout (little-endian):
//   offset 0  char[8]  magic "DSLCTOK1"
//   offset 8  u32      version (kShardVersion)
//   offset 12 u32      dtype (1 = uint16 tokens, 2 = uint32 tokens for vocabularies past 65,536)
//   offset 16 u32      vocab size the tokens were produced with
//   offset 20 u32      CRC32C of the token bytes
//   offset 24 u64      token count N
//   offset 32 N * sizeof(dtype) token bytes; the file size must be exactly 32 + N * sizeof(dtype).
// Training reads shards in place (token_files.hpp); read_shard reads a uint16 shard whole.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace desloc::data {

inline constexpr char kShardMagic[8] = {'D', 'S', 'L', 'C', 'T', 'O', 'K', '1'};
inline constexpr std::uint32_t kShardVersion = 1;
inline constexpr std::uint32_t kDtypeU16 = 1;
inline constexpr std::uint32_t kDtypeU32 = 2;

struct Shard {
  std::uint32_t vocab = 0;
  std::vector<std::uint16_t> tokens;
};

// Writes atomically (temporary file, fsync, rename).
void write_shard(const std::string& path, std::span<const std::uint16_t> tokens,
                 std::uint32_t vocab);
// The same with uint32 tokens (dtype 2), for a vocabulary of any size.
void write_shard(const std::string& path, std::span<const std::uint32_t> tokens,
                 std::uint32_t vocab);
// Throws DataError naming the path and what is wrong: missing file, wrong magic, unknown
// version or dtype, size that disagrees with the header (truncated), CRC mismatch, or a
// token id >= vocab.
Shard read_shard(const std::string& path);

}  // namespace desloc::data
