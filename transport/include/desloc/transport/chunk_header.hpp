// The header in front of every wide-area chunk (CollectiveOptions::chunk_headers): where the
// chunk belongs (membership epoch, training step, state kind, shard, byte offset, length) and
// a CRC32C of its payload. The receiver builds the header it expects at that point of the
// ring and compares; any difference is an error with that context, and the chunk is not used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace desloc::transport {

// Host byte order: every rank of a job runs the same build on the same architecture.
struct ChunkHeader {
  static constexpr std::uint32_t kMagic = 0x4b434c44;  // "DLCK"
  std::uint32_t magic = kMagic;
  std::uint8_t op = 0;       // CollectiveOp
  std::uint8_t state = 255;  // optim::StateKind, 255 = none
  std::uint16_t ring_step = 0;
  std::uint64_t epoch = 0;
  std::int64_t step = -1;
  std::uint32_t shard = 0;
  std::uint32_t length = 0;  // payload bytes
  std::uint64_t offset = 0;  // the payload's byte offset in the operation's buffer
  std::uint32_t seq = 0;     // operation sequence number within the group
  std::uint32_t crc = 0;     // CRC32C of the payload
};
static_assert(sizeof(ChunkHeader) == 48, "ChunkHeader must have no padding");

std::uint32_t payload_crc(std::span<const std::byte> payload);

// "" when `got` matches `want` in every field but crc and the payload matches got.crc;
// otherwise a sentence naming each disagreeing field (got vs expected) or the CRC mismatch.
std::string check_chunk(const ChunkHeader& want, const ChunkHeader& got,
                        std::span<const std::byte> payload);

}  // namespace desloc::transport
