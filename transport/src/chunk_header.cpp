// Chunk header checks, shared by every backend that sends wide-area chunks.
#include "desloc/transport/chunk_header.hpp"

#include <fmt/format.h>

#include "desloc/core/hash.hpp"

namespace desloc::transport {

std::uint32_t payload_crc(std::span<const std::byte> payload) {
  return crc32c({reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()});
}

std::string check_chunk(const ChunkHeader& want, const ChunkHeader& got,
                        std::span<const std::byte> payload) {
  std::string bad;
  auto field = [&](const char* name, auto g, auto w) {
    if (g != w) bad += fmt::format("{}{} {} (expected {})", bad.empty() ? "" : ", ", name, g, w);
  };
  field("magic", got.magic, want.magic);
  field("epoch", got.epoch, want.epoch);
  field("step", got.step, want.step);
  field("state", int(got.state), int(want.state));
  field("shard", got.shard, want.shard);
  field("operation", int(got.op), int(want.op));
  field("sequence", got.seq, want.seq);
  field("ring step", got.ring_step, want.ring_step);
  field("offset", got.offset, want.offset);
  field("length", got.length, want.length);
  if (!bad.empty())
    return "the chunk header disagrees: " + bad +
           "; the ranks are not running the same operation (different steps, states or "
           "membership epochs), so nothing was averaged in";
  const std::uint32_t crc = payload_crc(payload);
  if (crc != got.crc)
    return fmt::format(
        "CRC32C mismatch in the chunk at byte offset {} ({} bytes) of step {} state {} shard "
        "{}: computed {:08x}, the sender's header says {:08x}; the data was corrupted in "
        "transit or in the sender's memory, and was not averaged in",
        got.offset, got.length, got.step, int(got.state), got.shard, crc, got.crc);
  return {};
}

}  // namespace desloc::transport
