// Control-plane wire format: length-limited, versioned, CRC32C-checked frames and the
// messages they carry (rendezvous, authentication, membership, heartbeats).
// Every integer is little-endian on the wire; every decode is bounds-checked.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/transport/ip_address.hpp"

namespace desloc::transport {

// Frame header, 16 bytes:
//   magic u32 | frame version u16 | type u16 | payload length u32 | crc32c u32
// The CRC covers the first 12 header bytes and then the payload, so a flipped type or
// length is caught as surely as a flipped payload byte.
inline constexpr std::uint32_t kWireMagic = 0x50434c44;  // "DLCP" as bytes on the wire
inline constexpr std::uint16_t kWireVersion = 1;
inline constexpr std::size_t kFrameHeaderBytes = 16;
inline constexpr std::size_t kDefaultMaxPayloadBytes = std::size_t{1} << 20;  // 1 MiB

// Field limits, checked on encode and decode. They bound what a hostile peer can make us
// allocate independently of the frame limit.
inline constexpr std::size_t kMaxSiteNameBytes = 128;
inline constexpr std::size_t kMaxReasonBytes = 4096;
inline constexpr std::size_t kMaxAddressBytes = 64 * 1024;  // UCX worker addresses: ~0.1-4 KiB
inline constexpr std::size_t kMaxMacBytes = 64;
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMaxSnapshots = 16;  // rollback points a rank offers in Recover

enum class MessageType : std::uint16_t {
  kHello = 1,
  kChallenge = 2,
  kAuthResponse = 3,
  kWelcome = 4,
  kReject = 5,
  kMembership = 6,
  kHeartbeat = 7,
  kStatus = 8,
  kRecover = 9,
  kRecovery = 10,
  kBye = 11,
};
std::string_view message_type_name(MessageType type);

struct Frame {
  MessageType type{};
  std::vector<std::uint8_t> payload;
};

// One whole frame (header + payload) ready to write to a socket.
std::vector<std::uint8_t> encode_frame(MessageType type, std::span<const std::uint8_t> payload);

// Incremental decoder for a byte stream: feed() whatever the socket delivered, then call
// next() until it returns nullopt. A bad magic, an unsupported version, a length above the
// limit (checked from the header, before any payload is buffered) or a CRC mismatch throws
// DataError naming `source` and what was wrong; after that the decoder stays failed, because
// a byte stream has no way to resynchronise and the connection must be closed.
class FrameDecoder {
 public:
  explicit FrameDecoder(std::string source, std::size_t max_payload = kDefaultMaxPayloadBytes);

  void feed(std::span<const std::uint8_t> bytes);
  std::optional<Frame> next();
  // Bytes received but not yet returned as a frame (a partial frame at end of stream means
  // the peer stopped mid-frame).
  std::size_t buffered() const { return buffer_.size() - head_; }
  std::size_t max_payload() const { return max_payload_; }

 private:
  [[noreturn]] void fail(const std::string& what);

  std::string source_;
  std::size_t max_payload_;
  std::vector<std::uint8_t> buffer_;
  std::size_t head_ = 0;  // start of the unconsumed bytes in buffer_
  std::string error_;     // non-empty once the stream is known to be corrupt
};

// --- Control messages. Each has kType, and encode(msg) / decode<M>(frame) below.

// One key of a job config as text, for the coordinator to name the key two configs differ in.
// A value longer than kMaxConfigValueBytes travels as a digest of itself (config_value()).
struct ConfigValue {
  std::string key;  // "sync.codec_x"
  std::string value;
  bool operator==(const ConfigValue&) const = default;
};
inline constexpr std::size_t kMaxConfigKeyBytes = 128;
inline constexpr std::size_t kMaxConfigValueBytes = 256;
inline constexpr std::size_t kMaxConfigValues = 512;
// `value`, or "(<n> bytes, fnv1a64 <hex>)" when it is longer than kMaxConfigValueBytes: two
// ranks' long values (a job.sites of hundreds of names) still compare equal or not.
std::string config_value(std::string_view value);

// Rank -> coordinator, after authenticating: who I am and how to reach me over UCX.
struct Hello {
  static constexpr MessageType kType = MessageType::kHello;
  std::uint16_t protocol_version = 0;
  std::string site;
  std::uint32_t rank = 0;
  std::vector<std::uint8_t> worker_address;  // opaque ucp worker address
  std::uint64_t config_hash = 0;             // fnv1a64 of the job config both sides must share
  // 0 for a first registration; a rank reconnecting to a restarted coordinator sends the
  // membership epoch it trains in, and the coordinator rebuilds the membership from them.
  std::uint64_t epoch = 0;
  // The keys config_hash digests, so that a refusal can name the one that differs.
  std::vector<ConfigValue> config;
  bool operator==(const Hello&) const = default;
};

// Coordinator -> rank, first frame on every connection.
struct Challenge {
  static constexpr MessageType kType = MessageType::kChallenge;
  std::array<std::uint8_t, kNonceBytes> nonce{};
  bool operator==(const Challenge&) const = default;
};

// Rank -> coordinator: HMAC-SHA256(job token, nonce). Empty when the rank has no token, so
// the coordinator can say "no token" rather than "wrong token".
struct AuthResponse {
  static constexpr MessageType kType = MessageType::kAuthResponse;
  std::vector<std::uint8_t> mac;
  bool operator==(const AuthResponse&) const = default;
};

// Coordinator -> rank: registration accepted; the membership follows once the world is full.
struct Welcome {
  static constexpr MessageType kType = MessageType::kWelcome;
  std::string message;
  bool operator==(const Welcome&) const = default;
};

// Why a registration was refused; the client maps it to ConfigError or PeerFailure.
enum class RejectCode : std::uint16_t {
  kAuth = 1,             // wrong or missing job token
  kDuplicate = 2,        // (site, rank) already registered
  kVersion = 3,          // protocol version mismatch
  kConfigHash = 4,       // config hash mismatch
  kWorldSize = 5,        // rank or site beyond the expected world
  kProtocol = 6,         // malformed, oversized or out-of-order frame
  kHandshakeTimeout = 7  // did not finish the handshake in time
};
std::string_view reject_code_name(RejectCode code);

struct Reject {
  static constexpr MessageType kType = MessageType::kReject;
  RejectCode code = RejectCode::kProtocol;
  std::string reason;
  bool operator==(const Reject&) const = default;
};

struct MemberEntry {
  std::string site;
  std::uint32_t rank = 0;
  std::vector<std::uint8_t> worker_address;
  bool operator==(const MemberEntry&) const = default;
};

// The job's membership at one epoch. Epochs only grow: the coordinator opens a new one when a
// site fails, so every consumer must compare epochs rather than assume "the" membership.
struct Membership {
  static constexpr MessageType kType = MessageType::kMembership;
  std::uint64_t epoch = 0;
  std::vector<std::string> sites;         // site table; indices below refer to it
  std::vector<MemberEntry> members;       // every rank, sorted by (site, rank); site is in `sites`
  std::vector<std::uint32_t> ring_order;  // WAN ring as indices into `sites`, each once
  // 0 for the first epoch. After a failure: the step every member rolls back to (one of the
  // snapshots all of them offered in Recover) before continuing in this epoch.
  std::int64_t resume_step = 0;
  std::string note;  // why this epoch began, e.g. "site west lost (disconnected)"; "" at first
  // Sites that (re)join in this epoch: each receives the state at resume_step from its ring
  // predecessor that is not joining.
  std::vector<std::string> joining;
  bool operator==(const Membership&) const = default;
};

// Upper bounds (seconds) of the sync-duration histogram's buckets; a last bucket takes the rest.
inline constexpr std::array<double, 12> kSyncBucketBounds = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                                             0.5,   1.0,  2.5,   5.0,  10.0, 30.0};
inline constexpr std::size_t kSyncBuckets = kSyncBucketBounds.size() + 1;

// One wide-area lane of a rank: what it sent to its ring neighbour, cumulative, and the rate it
// achieved over its last few syncs.
struct LaneReport {
  std::uint64_t bytes_sent = 0;
  float recent_bytes_per_s = 0.0f;  // 0 before the lane's first sync
  bool operator==(const LaneReport&) const = default;
};

// What a rank reports about its training on every heartbeat (the status endpoint's figures);
// fixed size on the wire, whatever the job's length.
// A duration in a 32-bit milliseconds field (Recover's evidence, the heartbeat's TCP backlog):
// clamped to the field's range.
inline std::uint32_t wire_ms(std::chrono::milliseconds d) {
  return static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(d.count(), 0, std::numeric_limits<std::uint32_t>::max()));
}

struct RankReport {
  float loss = 0.0f;                 // the rank's site's training loss at the step (0 before one)
  float tokens_per_s = 0.0f;         // the rank's last step
  std::uint64_t wan_bytes_sent = 0;  // wide-area bytes this rank has sent (averages' payloads)
  // Every wide-area average of this rank's shard: how many took how long (bucket i counts the
  // durations in (bound[i-1], bound[i]]), and their total seconds.
  std::array<std::uint64_t, kSyncBuckets> sync_buckets{};
  double sync_seconds = 0.0;
  // Lane 0 sends to the next site of the ring; lane 1 (the reversed ring, transport.lanes = 2)
  // to the previous one.
  std::array<LaneReport, 2> lanes{};
  std::uint64_t guard_rejections = 0;  // sites the payload guard left out of this rank's averages
  std::int64_t kx = 0;        // the parameter-average period in force (0: the method has none)
  std::uint32_t replans = 0;  // period switches re-planning has made (sync.replan)
  // Hierarchical DES-LOC (job.regions): what the rank sent to the next live site of its region's
  // ring, and the rate it achieved there over its last few region averages.
  LaneReport region_lane{};
  // The rank process's TCP backlog as drain time (tcp_backlog.hpp), sampled by the rank client
  // as it sends each heartbeat, so a long average behind a slow link shows while it runs.
  std::uint32_t tcp_backlog_ms = 0;
  IpAddress tcp_backlog_peer = kNoAddress;  // where that slowest socket leads
  // The rank's site's wait for the slowest site at its latest average with a control exchange
  // (the slowest's compute since the exchange before, less its own), and all such waits
  // summed: a site that waits long at every average is faster than the pace the job keeps.
  std::uint32_t last_wait_ms = 0;
  double wait_seconds = 0.0;
  std::uint64_t syncs() const;  // the sum of sync_buckets
  bool operator==(const RankReport&) const = default;
};

// Rank -> coordinator, periodically: liveness plus progress (what the status endpoint shows).
struct Heartbeat {
  static constexpr MessageType kType = MessageType::kHeartbeat;
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  RankReport report;
  bool operator==(const Heartbeat&) const = default;
};

// Coordinator -> registered ranks while the world fills up, so a rank that times out can say
// who it was waiting for.
struct Status {
  static constexpr MessageType kType = MessageType::kStatus;
  std::uint32_t registered = 0;
  std::uint32_t expected = 0;
  std::vector<std::string> missing;  // "site/rank" or a summary such as "1 more site"
  bool operator==(const Status&) const = default;
};

// Coordinator -> ranks: the current epoch failed (a site was lost, or a rank reported a broken
// collective). Every rank aborts its collectives and answers with Recover.
struct Recovery {
  static constexpr MessageType kType = MessageType::kRecovery;
  std::uint64_t epoch = 0;  // the epoch being closed
  std::string reason;
  bool operator==(const Recovery&) const = default;
};

// Rank -> coordinator, after its collectives broke: where it can roll back to and how to reach
// its fresh UCX groups in the next epoch.
struct Recover {
  static constexpr MessageType kType = MessageType::kRecover;
  std::uint64_t epoch = 0;                   // the epoch whose collectives broke
  std::vector<std::int64_t> snapshots;       // steps this rank holds a rollback snapshot for
  std::vector<std::uint8_t> worker_address;  // new, as in Hello
  std::string reason;                        // what this rank saw fail
  // The straggler rule's evidence (Collective::failure_evidence, the largest over the rank's
  // groups): how long the rank had been in the operation that broke, the longest one of its
  // sends to a ring successor waited, and how long its TCP backlog needs to drain. Zeros when
  // no operation broke (a rank that learned of the failure between operations).
  std::uint32_t operation_ms = 0;
  std::uint32_t send_wait_ms = 0;
  std::uint32_t backlog_ms = 0;
  IpAddress backlog_peer = kNoAddress;  // the address the slowest socket is connected to
  bool operator==(const Recover&) const = default;
};

// Rank -> coordinator: this rank finished cleanly; its disconnect that follows is no failure.
struct Bye {
  static constexpr MessageType kType = MessageType::kBye;
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  bool operator==(const Bye&) const = default;
};

template <class M>
std::vector<std::uint8_t> encode(const M& message);  // whole frame
template <class M>
M decode(const Frame& frame);  // DataError if the type differs or any field is malformed

}  // namespace desloc::transport
