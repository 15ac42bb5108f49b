// Token shard files: a 32-byte little-endian header, then the uint16 tokens (see shard.hpp).
#include "desloc/data/shard.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/hash.hpp"

namespace desloc::data {
namespace {

// The format is little-endian and is read by memcpy; a big-endian port would need byte swaps.
static_assert(std::endian::native == std::endian::little, "shard I/O assumes a little-endian host");

constexpr std::size_t kHeaderBytes = 32;
constexpr std::string_view kRegenerate = "re-run `desloc prepare` to regenerate it";

[[noreturn]] void bad_shard(const std::string& path, const std::string& problem) {
  throw DataError("token shard '" + path + "': " + problem + "; " + std::string(kRegenerate));
}

std::string printable_magic(const char* magic) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    const auto c = static_cast<unsigned char>(magic[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  return out;
}

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

Shard read_shard(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw DataError("token shard '" + path +
                    "' does not exist or is not a regular file; check the path or re-run "
                    "`desloc prepare`");
  const std::vector<std::uint8_t> bytes = read_file(path);
  if (bytes.size() < kHeaderBytes)
    bad_shard(path, "truncated: the header needs " + std::to_string(kHeaderBytes) +
                        " bytes but the file has " + std::to_string(bytes.size()));

  ByteReader r(bytes, path);
  char magic[8];
  r.get_span(std::span<char>(magic), "magic");
  if (!std::equal(std::begin(magic), std::end(magic), std::begin(kShardMagic)))
    bad_shard(path, "wrong magic '" + printable_magic(magic) + "' at offset 0 (expected '" +
                        printable_magic(kShardMagic) + "'): not a desloc token shard");
  const auto version = r.get<std::uint32_t>("version");
  if (version != kShardVersion)
    bad_shard(path, "unsupported version " + std::to_string(version) +
                        " at offset 8 (this build reads version " + std::to_string(kShardVersion) +
                        ")");
  const auto dtype = r.get<std::uint32_t>("dtype");
  if (dtype != kDtypeU16)
    bad_shard(path, "unknown dtype " + std::to_string(dtype) + " at offset 12 (expected " +
                        std::to_string(kDtypeU16) + " = uint16)");
  Shard shard;
  shard.vocab = r.get<std::uint32_t>("vocab");
  if (shard.vocab == 0 || shard.vocab > 65536)
    bad_shard(path, "vocab " + std::to_string(shard.vocab) +
                        " at offset 16 does not fit uint16 tokens (must be 1..65536)");
  const auto crc = r.get<std::uint32_t>("crc32c");
  const auto count = r.get<std::uint64_t>("token count");

  // Compare in bytes without computing 2*count, which could overflow for a corrupt header.
  const std::uint64_t payload_bytes = bytes.size() - kHeaderBytes;
  const std::uint64_t expected_size_note =
      count <= (UINT64_MAX - kHeaderBytes) / 2 ? kHeaderBytes + 2 * count : UINT64_MAX;
  if (payload_bytes / 2 < count)
    bad_shard(path, "truncated: header says " + std::to_string(count) +
                        " tokens, so the file should be " + std::to_string(expected_size_note) +
                        " bytes, but it is " + std::to_string(bytes.size()) + " bytes");
  if (payload_bytes != 2 * count)
    bad_shard(path, std::to_string(payload_bytes - 2 * count) + " trailing bytes: header says " +
                        std::to_string(count) + " tokens, so the file should be " +
                        std::to_string(expected_size_note) + " bytes, but it is " +
                        std::to_string(bytes.size()) + " bytes");

  const std::span<const std::uint8_t> payload(bytes.data() + kHeaderBytes, payload_bytes);
  const std::uint32_t actual_crc = crc32c(payload);
  if (actual_crc != crc)
    bad_shard(path, "CRC32C mismatch over the " + std::to_string(payload_bytes) +
                        " token bytes at offset 32 (header " + std::to_string(crc) + ", computed " +
                        std::to_string(actual_crc) + "): the file is corrupt");

  shard.tokens.resize(count);
  // An empty vector's data() may be null, and memcpy(nullptr, _, 0) is undefined behaviour.
  if (count > 0) r.get_span(std::span<std::uint16_t>(shard.tokens), "tokens");
  for (std::size_t i = 0; i < shard.tokens.size(); ++i) {
    if (shard.tokens[i] >= shard.vocab)
      bad_shard(path, "token " + std::to_string(i) + " (offset " +
                          std::to_string(kHeaderBytes + 2 * i) + ") has id " +
                          std::to_string(shard.tokens[i]) + " >= vocab " +
                          std::to_string(shard.vocab));
  }
  return shard;
}

}  // namespace desloc::data
