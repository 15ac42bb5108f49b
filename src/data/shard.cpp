// Token shard files: a 32-byte little-endian header, then the tokens (see shard.hpp).
#include "desloc/data/shard.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/data/token_files.hpp"

namespace desloc::data {
namespace {

// The format is little-endian and is read by memcpy; a big-endian port would need byte swaps.
static_assert(std::endian::native == std::endian::little, "shard I/O assumes a little-endian host");

constexpr std::size_t kHeaderBytes = 32;
// The header and the tokens, each id checked against vocab; dtype says their width.
template <class T>
void write_tokens(const std::string& path, std::span<const T> tokens, std::uint32_t vocab,
                  std::uint32_t dtype) {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= vocab)
      throw DataError("cannot write token shard '" + path + "': token " + std::to_string(i) +
                      " has id " + std::to_string(tokens[i]) + " >= vocab " +
                      std::to_string(vocab));
  const auto payload = std::as_bytes(tokens);
  const std::span<const std::uint8_t> payload_u8(
      reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size());
  ByteWriter w;
  w.bytes().reserve(kHeaderBytes + payload.size());
  for (char c : kShardMagic) w.put(c);
  w.put<std::uint32_t>(kShardVersion);
  w.put<std::uint32_t>(dtype);
  w.put<std::uint32_t>(vocab);
  w.put<std::uint32_t>(crc32c(payload_u8));
  w.put<std::uint64_t>(tokens.size());
  w.put_span(tokens);
  write_file_atomic(path, w.bytes());
}

}  // namespace

void write_shard(const std::string& path, std::span<const std::uint16_t> tokens,
                 std::uint32_t vocab) {
  if (vocab == 0 || vocab > 65536)
    throw DataError("cannot write token shard '" + path + "': vocab " + std::to_string(vocab) +
                    " does not fit uint16 tokens (must be 1..65536)");
  write_tokens(path, tokens, vocab, kDtypeU16);
}

void write_shard(const std::string& path, std::span<const std::uint32_t> tokens,
                 std::uint32_t vocab) {
  if (vocab == 0)
    throw DataError("cannot write token shard '" + path + "': vocab must be positive");
  write_tokens(path, tokens, vocab, kDtypeU32);
}

// The same header checks, CRC32C and vocabulary checks as training's reads (token_files.cpp),
// then the tokens whole.
Shard read_shard(const std::string& path) {
  const TokenFile f = inspect_token_file(path, TokenFormat::kDesloc);
  if (f.width != 2)
    throw DataError("token shard '" + path +
                    "' holds uint32 tokens (dtype 2); read_shard reads uint16 shards");
  const TokenStream stream({f}, f.vocab, "shard");
  std::vector<std::int32_t> ids(f.count);
  stream.read(0, ids);
  return {f.vocab, std::vector<std::uint16_t>(ids.begin(), ids.end())};
}

}  // namespace desloc::data
