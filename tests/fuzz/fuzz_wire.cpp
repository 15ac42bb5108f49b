// libFuzzer target for the control-plane wire format (transport/src/wire.cpp): the streaming
// FrameDecoder and every message's payload decoder, on bytes as hostile as a peer can send.
//
// Per input:
//   1. the bytes as a stream, fed whole and fed in small chunks: both must yield the same
//      frames and fail (DataError) at the same point, since chunking is up to the socket;
//   2. the same stream with each frame's CRC32C repaired, so mutations reach the payload
//      decoder of every message type.
// Every message that decodes must re-encode to exactly the payload it came from.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/transport/wire.hpp"
#include "fuzz_common.hpp"

namespace {

using desloc::DataError;
using desloc::fuzz::oracle_failure;
namespace wire = desloc::transport;

// Small enough that the fuzzer's inputs (4 KiB by default) hit the length check.
constexpr std::size_t kMaxPayload = 1024;

struct StreamResult {
  std::vector<wire::Frame> frames;
  bool failed = false;
  std::size_t buffered = 0;
};

StreamResult decode_stream(std::span<const std::uint8_t> bytes, std::size_t chunk) {
  StreamResult out;
  wire::FrameDecoder decoder("fuzz", kMaxPayload);
  try {
    for (std::size_t pos = 0; pos < bytes.size(); pos += chunk) {
      decoder.feed(bytes.subspan(pos, std::min(chunk, bytes.size() - pos)));
      while (auto frame = decoder.next()) out.frames.push_back(std::move(*frame));
    }
  } catch (const DataError&) {
    out.failed = true;
    // A failed decoder must stay failed: the stream cannot resynchronise.
    bool refused = false;
    try {
      decoder.next();
    } catch (const DataError&) {
      refused = true;
    }
    if (!refused) oracle_failure("fuzz_wire", "FrameDecoder::next() succeeded after a failure");
    return out;
  }
  out.buffered = decoder.buffered();
  return out;
}

// Rewrites each complete frame's CRC so that the decoder accepts what the fuzzer mutated.
std::vector<std::uint8_t> repair_crcs(std::span<const std::uint8_t> bytes) {
  std::vector<std::uint8_t> out(bytes.begin(), bytes.end());
  std::size_t pos = 0;
  while (out.size() - pos >= wire::kFrameHeaderBytes) {
    std::uint8_t* h = out.data() + pos;
    const std::size_t length = desloc::fuzz::load_le(h + 8, 4);
    if (length > out.size() - pos - wire::kFrameHeaderBytes) break;
    const std::uint32_t crc =
        desloc::crc32c({h + wire::kFrameHeaderBytes, length}, desloc::crc32c({h, 12}));
    desloc::fuzz::store_le(h + 12, crc, 4);
    pos += wire::kFrameHeaderBytes + length;
  }
  return out;
}

// Decodes `frame` as M; on success M must re-encode to the same frame.
template <class M>
void decode_as(const wire::Frame& frame) {
  M message;
  try {
    message = wire::decode<M>(frame);
  } catch (const DataError&) {
    return;
  }
  const std::vector<std::uint8_t> again = wire::encode(message);
  const std::span<const std::uint8_t> payload(again.data() + wire::kFrameHeaderBytes,
                                              again.size() - wire::kFrameHeaderBytes);
  if (!std::equal(payload.begin(), payload.end(), frame.payload.begin(), frame.payload.end()))
    oracle_failure("fuzz_wire", std::string(wire::message_type_name(M::kType)) + " decoded from " +
                                    std::to_string(frame.payload.size()) + " bytes re-encodes to " +
                                    std::to_string(payload.size()) + " different bytes");
  // Compared as bytes, not with operator==: a heartbeat may carry a NaN loss (a site that
  // diverged says so), and NaN != NaN.
  if (wire::encode(wire::decode<M>(wire::Frame{M::kType, frame.payload})) != again)
    oracle_failure("fuzz_wire", "decoding the same payload twice gave different messages");
}

void decode_message(const wire::Frame& frame) {
  switch (frame.type) {
    case wire::MessageType::kHello:
      return decode_as<wire::Hello>(frame);
    case wire::MessageType::kChallenge:
      return decode_as<wire::Challenge>(frame);
    case wire::MessageType::kAuthResponse:
      return decode_as<wire::AuthResponse>(frame);
    case wire::MessageType::kWelcome:
      return decode_as<wire::Welcome>(frame);
    case wire::MessageType::kReject:
      return decode_as<wire::Reject>(frame);
    case wire::MessageType::kMembership:
      return decode_as<wire::Membership>(frame);
    case wire::MessageType::kHeartbeat:
      return decode_as<wire::Heartbeat>(frame);
    case wire::MessageType::kStatus:
      return decode_as<wire::Status>(frame);
    case wire::MessageType::kRecover:
      return decode_as<wire::Recover>(frame);
    case wire::MessageType::kRecovery:
      return decode_as<wire::Recovery>(frame);
    case wire::MessageType::kBye:
      return decode_as<wire::Bye>(frame);
  }
  // An unknown type is a valid frame; decoding it as any message must be refused.
  try {
    wire::decode<wire::Heartbeat>(frame);
  } catch (const DataError&) {
    return;
  }
  oracle_failure("fuzz_wire", "a frame of unknown type decoded as a Heartbeat");
}

void check_stream(std::span<const std::uint8_t> bytes) {
  const StreamResult whole = decode_stream(bytes, bytes.empty() ? 1 : bytes.size());
  // A chunk size from the input itself, so the fuzzer explores frame boundaries.
  const std::size_t chunk = bytes.empty() ? 1 : 1 + bytes.back() % 23;
  const StreamResult pieces = decode_stream(bytes, chunk);
  if (whole.failed != pieces.failed || whole.buffered != pieces.buffered ||
      whole.frames.size() != pieces.frames.size())
    oracle_failure("fuzz_wire", "feeding in chunks of " + std::to_string(chunk) +
                                    " bytes changed the outcome (" +
                                    std::to_string(whole.frames.size()) + " vs " +
                                    std::to_string(pieces.frames.size()) + " frames)");
  for (std::size_t i = 0; i < whole.frames.size(); ++i) {
    const wire::Frame& a = whole.frames[i];
    const wire::Frame& b = pieces.frames[i];
    if (a.type != b.type || a.payload != b.payload)
      oracle_failure("fuzz_wire", "frame " + std::to_string(i) + " differs when chunked");
    if (a.payload.size() > kMaxPayload)
      oracle_failure("fuzz_wire", "a frame above the payload limit was returned");
    decode_message(a);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  check_stream(bytes);
  check_stream(repair_crcs(bytes));
  return 0;
}
