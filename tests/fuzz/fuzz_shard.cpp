// libFuzzer target for the token shard reader (src/data/shard.cpp). read_shard only takes a
// path, so each input is written to a per-process scratch file. Each input is read twice: as
// it is (the size checks come before the checksum), and with the header's token count and
// CRC32C rewritten to match the bytes that follow, so that mutations reach the token checks.
#include <cstdint>
#include <span>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/data/shard.hpp"
#include "fuzz_common.hpp"

namespace {

// shard.hpp: magic[8] | u32 version | u32 dtype | u32 vocab | u32 crc | u64 count | tokens
constexpr std::size_t kCrcOffset = 20;
constexpr std::size_t kCountOffset = 24;
constexpr std::size_t kHeaderBytes = 32;

const desloc::fuzz::ScratchFile& scratch() {
  static const desloc::fuzz::ScratchFile file("shard");
  return file;
}

void read(std::span<const std::uint8_t> bytes) {
  desloc::data::Shard shard;
  try {
    shard = desloc::data::read_shard(scratch().write(bytes));
  } catch (const desloc::DataError&) {
    return;
  }
  // The loader indexes embeddings with these ids without checking them again.
  if (shard.vocab == 0 || shard.vocab > 65536)
    desloc::fuzz::oracle_failure("fuzz_shard", "accepted a vocab outside 1..65536");
  for (const std::uint16_t t : shard.tokens)
    if (t >= shard.vocab) desloc::fuzz::oracle_failure("fuzz_shard", "accepted a token >= vocab");
  if (kHeaderBytes + 2 * shard.tokens.size() != bytes.size())
    desloc::fuzz::oracle_failure("fuzz_shard", "token count disagrees with the file size");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  read(bytes);
  if (size >= kHeaderBytes) {
    std::vector<std::uint8_t> repaired(bytes.begin(), bytes.end());
    desloc::fuzz::store_le(repaired.data() + kCountOffset, (size - kHeaderBytes) / 2, 8);
    desloc::fuzz::store_le(repaired.data() + kCrcOffset,
                           desloc::crc32c({repaired.data() + kHeaderBytes, size - kHeaderBytes}),
                           4);
    read(repaired);
  }
  return 0;
}
