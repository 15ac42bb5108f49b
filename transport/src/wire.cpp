// Control-plane frames and message codecs. Decoding treats every byte as hostile: lengths and
// counts are checked against limits and against the bytes actually present before allocating.
#include "desloc/transport/wire.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdio>

#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"

namespace desloc::transport {
namespace {

void store_le(std::uint8_t* out, std::uint64_t value, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::uint8_t>(value >> (8 * i));
}
std::uint64_t load_le(const std::uint8_t* in, std::size_t bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v |= std::uint64_t{in[i]} << (8 * i);
  return v;
}

// Little-endian payload writer. Limits are enforced on encode too, so we never emit a frame
// our own decoder would refuse.
class WireWriter {
 public:
  explicit WireWriter(std::string_view message) : message_(message) {}
  template <class T>
  void put(T value) {
    std::uint8_t tmp[sizeof(T)];
    store_le(tmp, static_cast<std::uint64_t>(value), sizeof(T));
    bytes_.insert(bytes_.end(), tmp, tmp + sizeof(T));
  }
  void put_bytes(std::span<const std::uint8_t> b, std::size_t max_len, const char* field) {
    check_len(b.size(), max_len, field);
    put<std::uint32_t>(static_cast<std::uint32_t>(b.size()));
    bytes_.insert(bytes_.end(), b.begin(), b.end());
  }
  void put_string(std::string_view s, std::size_t max_len, const char* field) {
    put_bytes({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()}, max_len, field);
  }
  void put_count(std::size_t n, const char* field) {
    check_len(n, 0xffffffffu, field);
    put<std::uint32_t>(static_cast<std::uint32_t>(n));
  }
  void put_raw(std::span<const std::uint8_t> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  std::vector<std::uint8_t>& bytes() { return bytes_; }

 private:
  void check_len(std::size_t n, std::size_t max_len, const char* field) const {
    if (n > max_len)
      throw DataError("cannot encode " + std::string(message_) + ": field '" + field + "' has " +
                      std::to_string(n) + " bytes, above the limit of " + std::to_string(max_len));
  }
  std::string_view message_;
  std::vector<std::uint8_t> bytes_;
};

// Little-endian payload reader; every short read or oversized length is a DataError naming
// the message, the field and the offset.
class WireReader {
 public:
  WireReader(std::span<const std::uint8_t> bytes, std::string_view message)
      : bytes_(bytes), message_(message) {}
  template <class T>
  T get(const char* field) {
    need(sizeof(T), field);
    const T v = static_cast<T>(load_le(bytes_.data() + pos_, sizeof(T)));
    pos_ += sizeof(T);
    return v;
  }
  std::vector<std::uint8_t> get_bytes(std::size_t max_len, const char* field) {
    const std::size_t n = get_len(max_len, field);
    std::vector<std::uint8_t> out(bytes_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                  bytes_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return out;
  }
  std::string get_string(std::size_t max_len, const char* field) {
    const std::size_t n = get_len(max_len, field);
    std::string out(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return out;
  }
  // An element count, rejected if even `min_element_bytes` per element cannot fit in what is
  // left, so a forged count never drives a large reserve().
  std::size_t get_count(std::size_t min_element_bytes, const char* field) {
    const std::size_t n = get<std::uint32_t>(field);
    if (min_element_bytes > 0 && n > remaining() / min_element_bytes)
      fail(std::string("field '") + field + "' claims " + std::to_string(n) +
           " elements but only " + std::to_string(remaining()) + " bytes remain");
    return n;
  }
  void get_raw(std::span<std::uint8_t> out, const char* field) {
    need(out.size(), field);
    std::copy_n(bytes_.begin() + static_cast<std::ptrdiff_t>(pos_), out.size(), out.begin());
    pos_ += out.size();
  }
  void expect_end() {
    if (pos_ != bytes_.size())
      fail(std::to_string(bytes_.size() - pos_) + " unexpected trailing bytes at offset " +
           std::to_string(pos_));
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError("malformed " + std::string(message_) + " message: " + what +
                    "; the peer runs an incompatible or broken build");
  }
  std::size_t remaining() const { return bytes_.size() - pos_; }

 private:
  std::size_t get_len(std::size_t max_len, const char* field) {
    const std::size_t n = get<std::uint32_t>(field);
    if (n > max_len)
      fail(std::string("field '") + field + "' claims " + std::to_string(n) +
           " bytes, above the limit of " + std::to_string(max_len));
    need(n, field);
    return n;
  }
  void need(std::size_t n, const char* field) const {
    if (remaining() < n)
      fail(std::string("field '") + field + "' needs " + std::to_string(n) + " bytes at offset " +
           std::to_string(pos_) + " but only " + std::to_string(remaining()) + " remain");
  }
  std::span<const std::uint8_t> bytes_;
  std::string_view message_;
  std::size_t pos_ = 0;
};

std::uint32_t frame_crc(std::span<const std::uint8_t> header12,
                        std::span<const std::uint8_t> payload) {
  return crc32c(payload, crc32c(header12));
}

// --- per-message payload codecs (overloads picked by encode<M>/decode<M>)

void write_payload(WireWriter& w, const Hello& m) {
  w.put<std::uint16_t>(m.protocol_version);
  w.put_string(m.site, kMaxSiteNameBytes, "site");
  w.put<std::uint32_t>(m.rank);
  w.put_bytes(m.worker_address, kMaxAddressBytes, "worker_address");
  w.put<std::uint64_t>(m.config_hash);
  w.put<std::uint64_t>(m.epoch);
  if (m.config.size() > kMaxConfigValues)
    throw DataError(fmt::format("cannot encode Hello: {} config values, at most {}",
                                m.config.size(), kMaxConfigValues));
  w.put<std::uint16_t>(static_cast<std::uint16_t>(m.config.size()));
  for (const ConfigValue& v : m.config) {
    w.put_string(v.key, kMaxConfigKeyBytes, "config key");
    w.put_string(v.value, kMaxConfigValueBytes, "config value");
  }
}
void read_payload(WireReader& r, Hello& m) {
  m.protocol_version = r.get<std::uint16_t>("protocol_version");
  m.site = r.get_string(kMaxSiteNameBytes, "site");
  m.rank = r.get<std::uint32_t>("rank");
  m.worker_address = r.get_bytes(kMaxAddressBytes, "worker_address");
  m.config_hash = r.get<std::uint64_t>("config_hash");
  m.epoch = r.get<std::uint64_t>("epoch");
  const auto n = r.get<std::uint16_t>("config values");
  if (n > kMaxConfigValues)
    r.fail(fmt::format("{} config values, at most {}", n, kMaxConfigValues));
  m.config.resize(n);
  for (ConfigValue& v : m.config) {
    v.key = r.get_string(kMaxConfigKeyBytes, "config key");
    v.value = r.get_string(kMaxConfigValueBytes, "config value");
  }
}

void write_payload(WireWriter& w, const Challenge& m) { w.put_raw(m.nonce); }
void read_payload(WireReader& r, Challenge& m) { r.get_raw(m.nonce, "nonce"); }

void write_payload(WireWriter& w, const AuthResponse& m) {
  w.put_bytes(m.mac, kMaxMacBytes, "mac");
}
void read_payload(WireReader& r, AuthResponse& m) { m.mac = r.get_bytes(kMaxMacBytes, "mac"); }

void write_payload(WireWriter& w, const Welcome& m) {
  w.put_string(m.message, kMaxReasonBytes, "message");
}
void read_payload(WireReader& r, Welcome& m) {
  m.message = r.get_string(kMaxReasonBytes, "message");
}

void write_payload(WireWriter& w, const Reject& m) {
  w.put<std::uint16_t>(static_cast<std::uint16_t>(m.code));
  w.put_string(m.reason, kMaxReasonBytes, "reason");
}
void read_payload(WireReader& r, Reject& m) {
  const auto code = r.get<std::uint16_t>("code");
  if (code < static_cast<std::uint16_t>(RejectCode::kAuth) ||
      code > static_cast<std::uint16_t>(RejectCode::kHandshakeTimeout))
    r.fail("unknown reject code " + std::to_string(code));
  m.code = static_cast<RejectCode>(code);
  m.reason = r.get_string(kMaxReasonBytes, "reason");
}

void write_payload(WireWriter& w, const Membership& m) {
  w.put<std::uint64_t>(m.epoch);
  w.put_count(m.sites.size(), "sites");
  for (const auto& s : m.sites) w.put_string(s, kMaxSiteNameBytes, "sites[]");
  w.put_count(m.members.size(), "members");
  for (const auto& e : m.members) {
    w.put_string(e.site, kMaxSiteNameBytes, "members[].site");
    w.put<std::uint32_t>(e.rank);
    w.put_bytes(e.worker_address, kMaxAddressBytes, "members[].worker_address");
  }
  w.put_count(m.ring_order.size(), "ring_order");
  for (auto i : m.ring_order) w.put<std::uint32_t>(i);
  w.put<std::int64_t>(m.resume_step);
  w.put_string(m.note, kMaxReasonBytes, "note");
  w.put_count(m.joining.size(), "joining");
  for (const auto& site : m.joining) w.put_string(site, kMaxSiteNameBytes, "joining[]");
}
void read_payload(WireReader& r, Membership& m) {
  m.epoch = r.get<std::uint64_t>("epoch");
  const std::size_t n_sites = r.get_count(4, "sites");
  m.sites.reserve(n_sites);
  for (std::size_t i = 0; i < n_sites; ++i)
    m.sites.push_back(r.get_string(kMaxSiteNameBytes, "sites[]"));
  const std::size_t n_members = r.get_count(12, "members");
  m.members.reserve(n_members);
  for (std::size_t i = 0; i < n_members; ++i) {
    MemberEntry e;
    e.site = r.get_string(kMaxSiteNameBytes, "members[].site");
    e.rank = r.get<std::uint32_t>("members[].rank");
    e.worker_address = r.get_bytes(kMaxAddressBytes, "members[].worker_address");
    if (std::find(m.sites.begin(), m.sites.end(), e.site) == m.sites.end())
      r.fail("member site '" + e.site + "' is not in the site table");
    m.members.push_back(std::move(e));
  }
  const std::size_t n_ring = r.get_count(4, "ring_order");
  if (n_ring != n_sites)
    r.fail("ring_order has " + std::to_string(n_ring) + " entries for " + std::to_string(n_sites) +
           " sites");
  std::vector<bool> seen(n_sites, false);
  for (std::size_t i = 0; i < n_ring; ++i) {
    const auto idx = r.get<std::uint32_t>("ring_order[]");
    if (idx >= n_sites || seen[idx])
      r.fail("ring_order entry " + std::to_string(idx) + " is out of range or repeated");
    seen[idx] = true;
    m.ring_order.push_back(idx);
  }
  m.resume_step = r.get<std::int64_t>("resume_step");
  if (m.resume_step < 0) r.fail("resume_step " + std::to_string(m.resume_step) + " is negative");
  m.note = r.get_string(kMaxReasonBytes, "note");
  const std::size_t n_joining = r.get_count(4, "joining");
  for (std::size_t i = 0; i < n_joining; ++i) {
    m.joining.push_back(r.get_string(kMaxSiteNameBytes, "joining[]"));
    if (std::find(m.sites.begin(), m.sites.end(), m.joining.back()) == m.sites.end())
      r.fail("joining site '" + m.joining.back() + "' is not in the site table");
  }
}

void write_payload(WireWriter& w, const Heartbeat& m) {
  const RankReport& p = m.report;
  w.put<std::uint64_t>(m.epoch);
  w.put<std::uint64_t>(m.step);
  w.put<std::uint32_t>(std::bit_cast<std::uint32_t>(p.loss));
  w.put<std::uint32_t>(std::bit_cast<std::uint32_t>(p.tokens_per_s));
  w.put<std::uint64_t>(p.wan_bytes_sent);
  for (const std::uint64_t n : p.sync_buckets) w.put<std::uint64_t>(n);
  w.put<std::uint64_t>(std::bit_cast<std::uint64_t>(p.sync_seconds));
  for (const LaneReport& lane : p.lanes) {
    w.put<std::uint64_t>(lane.bytes_sent);
    w.put<std::uint32_t>(std::bit_cast<std::uint32_t>(lane.recent_bytes_per_s));
  }
  w.put<std::uint64_t>(p.guard_rejections);
  w.put<std::uint64_t>(std::bit_cast<std::uint64_t>(p.kx));
  w.put<std::uint32_t>(p.replans);
  w.put<std::uint64_t>(p.region_lane.bytes_sent);
  w.put<std::uint32_t>(std::bit_cast<std::uint32_t>(p.region_lane.recent_bytes_per_s));
  w.put<std::uint32_t>(p.tcp_backlog_ms);
  w.put_raw(p.tcp_backlog_peer);
  w.put<std::uint32_t>(p.last_wait_ms);
  w.put<std::uint64_t>(std::bit_cast<std::uint64_t>(p.wait_seconds));
}
void read_payload(WireReader& r, Heartbeat& m) {
  RankReport& p = m.report;
  m.epoch = r.get<std::uint64_t>("epoch");
  m.step = r.get<std::uint64_t>("step");
  p.loss = std::bit_cast<float>(r.get<std::uint32_t>("loss"));
  p.tokens_per_s = std::bit_cast<float>(r.get<std::uint32_t>("tokens_per_s"));
  p.wan_bytes_sent = r.get<std::uint64_t>("wan_bytes_sent");
  for (std::uint64_t& n : p.sync_buckets) n = r.get<std::uint64_t>("sync_buckets[]");
  p.sync_seconds = std::bit_cast<double>(r.get<std::uint64_t>("sync_seconds"));
  for (LaneReport& lane : p.lanes) {
    lane.bytes_sent = r.get<std::uint64_t>("lanes[].bytes_sent");
    lane.recent_bytes_per_s = std::bit_cast<float>(r.get<std::uint32_t>("lanes[].recent_rate"));
  }
  p.guard_rejections = r.get<std::uint64_t>("guard_rejections");
  p.kx = std::bit_cast<std::int64_t>(r.get<std::uint64_t>("kx"));
  p.replans = r.get<std::uint32_t>("replans");
  p.region_lane.bytes_sent = r.get<std::uint64_t>("region_lane.bytes_sent");
  p.region_lane.recent_bytes_per_s = std::bit_cast<float>(r.get<std::uint32_t>("region_lane.rate"));
  p.tcp_backlog_ms = r.get<std::uint32_t>("tcp_backlog_ms");
  r.get_raw(p.tcp_backlog_peer, "tcp_backlog_peer");
  p.last_wait_ms = r.get<std::uint32_t>("last_wait_ms");
  p.wait_seconds = std::bit_cast<double>(r.get<std::uint64_t>("wait_seconds"));
}

void write_payload(WireWriter& w, const Status& m) {
  w.put<std::uint32_t>(m.registered);
  w.put<std::uint32_t>(m.expected);
  w.put_count(m.missing.size(), "missing");
  for (const auto& s : m.missing) w.put_string(s, kMaxSiteNameBytes + 32, "missing[]");
}
void read_payload(WireReader& r, Status& m) {
  m.registered = r.get<std::uint32_t>("registered");
  m.expected = r.get<std::uint32_t>("expected");
  const std::size_t n = r.get_count(4, "missing");
  m.missing.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    m.missing.push_back(r.get_string(kMaxSiteNameBytes + 32, "missing[]"));
}

void write_payload(WireWriter& w, const Recovery& m) {
  w.put<std::uint64_t>(m.epoch);
  w.put_string(m.reason, kMaxReasonBytes, "reason");
}
void read_payload(WireReader& r, Recovery& m) {
  m.epoch = r.get<std::uint64_t>("epoch");
  m.reason = r.get_string(kMaxReasonBytes, "reason");
}

void write_payload(WireWriter& w, const Recover& m) {
  w.put<std::uint64_t>(m.epoch);
  if (m.snapshots.size() > kMaxSnapshots)
    throw DataError("cannot encode Recover: " + std::to_string(m.snapshots.size()) +
                    " snapshots, above the limit of " + std::to_string(kMaxSnapshots));
  w.put_count(m.snapshots.size(), "snapshots");
  for (auto s : m.snapshots) w.put<std::int64_t>(s);
  w.put_bytes(m.worker_address, kMaxAddressBytes, "worker_address");
  w.put_string(m.reason, kMaxReasonBytes, "reason");
  w.put<std::uint32_t>(m.operation_ms);
  w.put<std::uint32_t>(m.send_wait_ms);
  w.put<std::uint32_t>(m.backlog_ms);
  w.put_raw(m.backlog_peer);
}
void read_payload(WireReader& r, Recover& m) {
  m.epoch = r.get<std::uint64_t>("epoch");
  const std::size_t n = r.get_count(8, "snapshots");
  if (n > kMaxSnapshots)
    r.fail("field 'snapshots' has " + std::to_string(n) + " entries, above the limit of " +
           std::to_string(kMaxSnapshots));
  for (std::size_t i = 0; i < n; ++i) {
    const auto s = r.get<std::int64_t>("snapshots[]");
    if (s < 0) r.fail("snapshot step " + std::to_string(s) + " is negative");
    m.snapshots.push_back(s);
  }
  m.worker_address = r.get_bytes(kMaxAddressBytes, "worker_address");
  m.reason = r.get_string(kMaxReasonBytes, "reason");
  m.operation_ms = r.get<std::uint32_t>("operation_ms");
  m.send_wait_ms = r.get<std::uint32_t>("send_wait_ms");
  m.backlog_ms = r.get<std::uint32_t>("backlog_ms");
  r.get_raw(m.backlog_peer, "backlog_peer");
}

void write_payload(WireWriter& w, const Bye& m) {
  w.put<std::uint64_t>(m.epoch);
  w.put<std::uint64_t>(m.step);
}
void read_payload(WireReader& r, Bye& m) {
  m.epoch = r.get<std::uint64_t>("epoch");
  m.step = r.get<std::uint64_t>("step");
}

}  // namespace

std::uint64_t RankReport::syncs() const {
  std::uint64_t n = 0;
  for (const std::uint64_t b : sync_buckets) n += b;
  return n;
}

std::string config_value(std::string_view value) {
  if (value.size() <= kMaxConfigValueBytes) return std::string(value);
  char digest[96];
  std::snprintf(digest, sizeof digest, "(%zu bytes, fnv1a64 %016llx)", value.size(),
                static_cast<unsigned long long>(fnv1a64(value)));
  return digest;
}

std::string_view message_type_name(MessageType type) {
  switch (type) {
    case MessageType::kHello:
      return "Hello";
    case MessageType::kChallenge:
      return "Challenge";
    case MessageType::kAuthResponse:
      return "AuthResponse";
    case MessageType::kWelcome:
      return "Welcome";
    case MessageType::kReject:
      return "Reject";
    case MessageType::kMembership:
      return "Membership";
    case MessageType::kHeartbeat:
      return "Heartbeat";
    case MessageType::kStatus:
      return "Status";
    case MessageType::kRecover:
      return "Recover";
    case MessageType::kRecovery:
      return "Recovery";
    case MessageType::kBye:
      return "Bye";
  }
  return "unknown";
}

std::string_view reject_code_name(RejectCode code) {
  switch (code) {
    case RejectCode::kAuth:
      return "auth";
    case RejectCode::kDuplicate:
      return "duplicate";
    case RejectCode::kVersion:
      return "version";
    case RejectCode::kConfigHash:
      return "config-hash";
    case RejectCode::kWorldSize:
      return "world-size";
    case RejectCode::kProtocol:
      return "protocol";
    case RejectCode::kHandshakeTimeout:
      return "handshake-timeout";
  }
  return "unknown";
}

std::vector<std::uint8_t> encode_frame(MessageType type, std::span<const std::uint8_t> payload) {
  if (payload.size() > 0xffffffffu)
    throw DataError("cannot encode a " + std::string(message_type_name(type)) +
                    " frame: payload of " + std::to_string(payload.size()) +
                    " bytes does not fit the 32-bit length field");
  std::vector<std::uint8_t> out(kFrameHeaderBytes + payload.size());
  store_le(out.data() + 0, kWireMagic, 4);
  store_le(out.data() + 4, kWireVersion, 2);
  store_le(out.data() + 6, static_cast<std::uint16_t>(type), 2);
  store_le(out.data() + 8, payload.size(), 4);
  store_le(out.data() + 12, frame_crc({out.data(), 12}, payload), 4);
  std::copy(payload.begin(), payload.end(), out.begin() + kFrameHeaderBytes);
  return out;
}

FrameDecoder::FrameDecoder(std::string source, std::size_t max_payload)
    : source_(std::move(source)), max_payload_(max_payload) {}

void FrameDecoder::fail(const std::string& what) {
  error_ = "bad frame from " + source_ + ": " + what + "; closing the connection";
  throw DataError(error_);
}

void FrameDecoder::feed(std::span<const std::uint8_t> bytes) {
  if (!error_.empty()) throw DataError(error_);
  // Reclaim consumed bytes first so the buffer stays near one frame in size.
  if (head_ > 0 && head_ >= buffer_.size() / 2) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
}

std::optional<Frame> FrameDecoder::next() {
  if (!error_.empty()) throw DataError(error_);
  if (buffered() < kFrameHeaderBytes) return std::nullopt;
  const std::uint8_t* h = buffer_.data() + head_;
  const auto magic = static_cast<std::uint32_t>(load_le(h, 4));
  if (magic != kWireMagic) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", magic);
    fail(std::string("bad magic ") + hex + " (is this a desloc control-plane peer?)");
  }
  const auto version = static_cast<std::uint16_t>(load_le(h + 4, 2));
  if (version != kWireVersion)
    fail("unsupported frame version " + std::to_string(version) + " (this build speaks " +
         std::to_string(kWireVersion) + "); run the same desloc build everywhere");
  const auto type = static_cast<std::uint16_t>(load_le(h + 6, 2));
  const std::size_t length = load_le(h + 8, 4);
  if (length > max_payload_)
    fail("payload length " + std::to_string(length) + " bytes exceeds the limit of " +
         std::to_string(max_payload_) + " (" + std::string(message_type_name(MessageType{type})) +
         " frame)");
  if (buffered() < kFrameHeaderBytes + length) return std::nullopt;
  std::span<const std::uint8_t> payload(h + kFrameHeaderBytes, length);
  const auto expected_crc = static_cast<std::uint32_t>(load_le(h + 12, 4));
  const std::uint32_t actual_crc = frame_crc({h, 12}, payload);
  if (actual_crc != expected_crc)
    fail("CRC32C mismatch (header says " + std::to_string(expected_crc) + ", computed " +
         std::to_string(actual_crc) + ") on a " + std::to_string(length) + "-byte payload");
  Frame frame{static_cast<MessageType>(type), {payload.begin(), payload.end()}};
  head_ += kFrameHeaderBytes + length;
  return frame;
}

template <class M>
std::vector<std::uint8_t> encode(const M& message) {
  WireWriter w(message_type_name(M::kType));
  write_payload(w, message);
  return encode_frame(M::kType, w.bytes());
}

template <class M>
M decode(const Frame& frame) {
  if (frame.type != M::kType)
    throw DataError("expected a " + std::string(message_type_name(M::kType)) +
                    " message but received " + std::string(message_type_name(frame.type)) +
                    " (type " + std::to_string(static_cast<unsigned>(frame.type)) + ")");
  WireReader r(frame.payload, message_type_name(M::kType));
  M m;
  read_payload(r, m);
  r.expect_end();
  return m;
}

#define DESLOC_WIRE_INSTANTIATE(M)                                \
  template std::vector<std::uint8_t> encode<M>(const M& message); \
  template M decode<M>(const Frame& frame);
DESLOC_WIRE_INSTANTIATE(Hello)
DESLOC_WIRE_INSTANTIATE(Challenge)
DESLOC_WIRE_INSTANTIATE(AuthResponse)
DESLOC_WIRE_INSTANTIATE(Welcome)
DESLOC_WIRE_INSTANTIATE(Reject)
DESLOC_WIRE_INSTANTIATE(Membership)
DESLOC_WIRE_INSTANTIATE(Heartbeat)
DESLOC_WIRE_INSTANTIATE(Status)
DESLOC_WIRE_INSTANTIATE(Recovery)
DESLOC_WIRE_INSTANTIATE(Recover)
DESLOC_WIRE_INSTANTIATE(Bye)
#undef DESLOC_WIRE_INSTANTIATE

}  // namespace desloc::transport
