// Wire format: every control message round-trips, the decoder is incremental, and corrupt or
// hostile bytes end in a DataError (never a crash, never a frame with a bad CRC).
#include "desloc/transport/wire.hpp"

#include <gtest/gtest.h>

#include <random>

#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"

namespace desloc::transport {
namespace {

Membership sample_membership() {
  Membership m;
  m.epoch = 7;
  m.sites = {"east", "west"};
  m.members = {{"east", 0, {1, 2, 3}}, {"east", 1, {}}, {"west", 0, {9}}, {"west", 1, {7, 7}}};
  m.ring_order = {1, 0};
  return m;
}

template <class M>
M round_trip(const M& m) {
  const auto bytes = encode(m);
  FrameDecoder dec("test");
  dec.feed(bytes);
  auto frame = dec.next();
  EXPECT_TRUE(frame.has_value());
  EXPECT_FALSE(dec.next().has_value());
  EXPECT_EQ(dec.buffered(), 0u);
  return decode<M>(*frame);
}

TEST(Wire, EveryMessageRoundTrips) {
  const Hello hello{3,
                    "site-a",
                    5,
                    {0xde, 0xad, 0xbe, 0xef},
                    0x0123456789abcdefull,
                    4,
                    {{"sync.kx", "16"}, {"sync.codec_x", "\"int4\""}}};
  EXPECT_EQ(round_trip(hello), hello);
  Challenge ch;
  for (std::size_t i = 0; i < ch.nonce.size(); ++i) ch.nonce[i] = static_cast<std::uint8_t>(i);
  EXPECT_EQ(round_trip(ch), ch);
  const AuthResponse auth{std::vector<std::uint8_t>(32, 0xab)};
  EXPECT_EQ(round_trip(auth), auth);
  EXPECT_EQ(round_trip(AuthResponse{}), AuthResponse{});
  EXPECT_EQ(round_trip(Welcome{"hi"}), Welcome{"hi"});
  const Reject rej{RejectCode::kConfigHash, "hash differs"};
  EXPECT_EQ(round_trip(rej), rej);
  EXPECT_EQ(round_trip(sample_membership()), sample_membership());
  const Heartbeat hb{1, 123456789012345ull};
  EXPECT_EQ(round_trip(hb), hb);
  const Status st{3, 4, {"west/1"}};
  EXPECT_EQ(round_trip(st), st);
  auto recovered = sample_membership();
  recovered.resume_step = 96;
  recovered.note = "site west lost (disconnected)";
  recovered.joining = {recovered.sites.at(0)};
  EXPECT_EQ(round_trip(recovered), recovered);
  const Recovery rec{2, "site west lost"};
  EXPECT_EQ(round_trip(rec), rec);
  const Recover back{2,    {64, 96}, {1, 2, 3}, "all_reduce #9 timed out",
                     5012, 4870,     31000,     parse_ip_address("fe80::7")};
  EXPECT_EQ(round_trip(back), back);
  EXPECT_EQ(ip_text(round_trip(back).backlog_peer), "fe80::7");
  EXPECT_EQ(round_trip(Bye{3, 500}), (Bye{3, 500}));
}

TEST(Wire, RecoverRejectsTooManyOrNegativeSnapshots) {
  Recover many{1, std::vector<std::int64_t>(kMaxSnapshots + 1, 5), {}, ""};
  EXPECT_THROW(encode(many), DataError);
  Recover negative{1, {-3}, {}, ""};
  const auto bytes = encode(negative);  // the encoder allows it; the decoder must not
  FrameDecoder dec("test");
  dec.feed(bytes);
  const auto frame = dec.next();
  ASSERT_TRUE(frame.has_value());
  EXPECT_THROW(decode<Recover>(*frame), DataError);
}

TEST(Wire, DecoderAcceptsByteByByteFeedAcrossFrames) {
  std::vector<std::uint8_t> stream;
  for (int i = 0; i < 3; ++i) {
    const auto f = encode(Heartbeat{1, static_cast<std::uint64_t>(i)});
    stream.insert(stream.end(), f.begin(), f.end());
  }
  const auto m = encode(sample_membership());
  stream.insert(stream.end(), m.begin(), m.end());

  FrameDecoder dec("bytewise");
  std::vector<Frame> frames;
  for (auto b : stream) {
    dec.feed({&b, 1});
    while (auto f = dec.next()) frames.push_back(std::move(*f));
  }
  ASSERT_EQ(frames.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(decode<Heartbeat>(frames[i]).step, std::uint64_t(i));
  EXPECT_EQ(decode<Membership>(frames[3]), sample_membership());
  EXPECT_EQ(dec.buffered(), 0u);
}

void expect_rejected(std::vector<std::uint8_t> bytes, const std::string& needle,
                     std::size_t max_payload = kDefaultMaxPayloadBytes) {
  FrameDecoder dec("peer 1.2.3.4:5", max_payload);
  dec.feed(bytes);
  try {
    (void)dec.next();
    FAIL() << "expected a DataError mentioning '" << needle << "'";
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("peer 1.2.3.4:5"), std::string::npos) << e.message();
  }
  // The stream cannot resynchronise, so the decoder stays failed.
  EXPECT_THROW(dec.next(), DataError);
}

TEST(Wire, CorruptHeadersAndPayloadsAreRejected) {
  const auto good = encode(Welcome{"payload"});
  auto bad_magic = good;
  bad_magic[0] ^= 0xff;
  expect_rejected(bad_magic, "bad magic");
  auto bad_version = good;
  bad_version[4] = 9;
  expect_rejected(bad_version, "unsupported frame version 9");
  auto bad_crc = good;
  bad_crc[kFrameHeaderBytes + 2] ^= 0x01;  // a payload byte
  expect_rejected(bad_crc, "CRC32C mismatch");
  auto bad_type = good;  // the CRC covers the header, so a flipped type is caught too
  bad_type[6] ^= 0x01;
  expect_rejected(bad_type, "CRC32C mismatch");
}

TEST(Wire, OversizedLengthIsRejectedFromTheHeaderAlone) {
  auto header = encode(Welcome{"x"});
  header.resize(kFrameHeaderBytes);
  header[8] = 0xff, header[9] = 0xff, header[10] = 0xff, header[11] = 0x7f;  // ~2 GiB
  expect_rejected(header, "exceeds the limit");
  // A configurable limit applies the same way.
  expect_rejected(encode(Welcome{std::string(200, 'a')}), "exceeds the limit of 64", 64);
}

TEST(Wire, TruncatedFramesWaitAndMalformedPayloadsThrow) {
  const auto good = encode(sample_membership());
  FrameDecoder dec("trunc");
  dec.feed({good.data(), good.size() - 1});
  EXPECT_FALSE(dec.next().has_value());
  EXPECT_EQ(dec.buffered(), good.size() - 1);

  // A well-framed but truncated payload fails in the message decoder, naming the field.
  const auto full = encode(Hello{1, "abc", 0, {1, 2, 3}, 5});
  std::vector<std::uint8_t> payload(full.begin() + kFrameHeaderBytes, full.end() - 12);
  try {
    decode<Hello>(Frame{MessageType::kHello, payload});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find("config_hash"), std::string::npos) << e.message();
  }
  // Wrong type and trailing bytes.
  EXPECT_THROW(decode<Welcome>(Frame{MessageType::kHello, payload}), DataError);
  std::vector<std::uint8_t> hb(16, 0);
  hb.push_back(0);
  EXPECT_THROW(decode<Heartbeat>(Frame{MessageType::kHeartbeat, hb}), DataError);
  // A string length beyond its limit is refused before any allocation.
  std::vector<std::uint8_t> huge = {0xff, 0xff, 0xff, 0x0f};
  EXPECT_THROW(decode<Welcome>(Frame{MessageType::kWelcome, huge}), DataError);
  // A member count that cannot fit in the remaining bytes.
  std::vector<std::uint8_t> m(8, 0);
  m.insert(m.end(), {0xff, 0xff, 0xff, 0xff});
  EXPECT_THROW(decode<Membership>(Frame{MessageType::kMembership, m}), DataError);
  // Ring order referring to a site that does not exist.
  auto bad_ring = sample_membership();
  bad_ring.ring_order = {0, 5};
  const auto bad_ring_frame = encode(bad_ring);
  EXPECT_THROW(
      decode<Membership>(Frame{MessageType::kMembership,
                               {bad_ring_frame.begin() + kFrameHeaderBytes, bad_ring_frame.end()}}),
      DataError);
}

TEST(Wire, EncodeEnforcesFieldLimits) {
  EXPECT_THROW(encode(Hello{1, std::string(kMaxSiteNameBytes + 1, 's'), 0, {}, 0}), DataError);
  EXPECT_THROW(
      encode(Hello{1, "a", 0, {}, 0, 0, {{"k", std::string(kMaxConfigValueBytes + 1, 'v')}}}),
      DataError);
  EXPECT_THROW(
      encode(
          Hello{1, "a", 0, {}, 0, 0, std::vector<ConfigValue>(kMaxConfigValues + 1, {"k", "v"})}),
      DataError);
}

// Fixed-seed fuzz: random garbage, and valid frames with random bit flips, fed in random
// chunk sizes. The decoder may throw DataError but must never crash, and every frame it
// yields must carry a matching CRC.
TEST(Wire, FuzzNeverCrashesNorYieldsABadFrame) {
  std::mt19937_64 rng(20250522);
  const std::vector<std::vector<std::uint8_t>> seeds = {
      encode(sample_membership()), encode(Hello{1, "a", 2, {1}, 3}), encode(Heartbeat{1, 2}),
      encode(Reject{RejectCode::kAuth, "no"})};
  std::size_t frames_seen = 0, errors_seen = 0;
  for (int iter = 0; iter < 10000; ++iter) {
    std::vector<std::uint8_t> bytes;
    if (iter % 2 == 0) {
      bytes.resize(rng() % 256);
      for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
      if (iter % 4 == 0 && bytes.size() >= 6) {  // start with the right magic to go deeper
        const auto& s = seeds[rng() % seeds.size()];
        std::copy_n(s.begin(), 6, bytes.begin());
      }
    } else {
      bytes = seeds[rng() % seeds.size()];
      const int flips = 1 + static_cast<int>(rng() % 3);
      for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= 1u << (rng() % 8);
    }
    FrameDecoder dec("fuzz", 4096);
    try {
      std::size_t pos = 0;
      while (pos < bytes.size()) {
        const std::size_t n = std::min<std::size_t>(1 + rng() % 64, bytes.size() - pos);
        dec.feed({bytes.data() + pos, n});
        pos += n;
        while (auto f = dec.next()) {
          ++frames_seen;
          // Re-encoding the frame reproduces the checked bytes, CRC included.
          const auto again = encode_frame(f->type, f->payload);
          ASSERT_TRUE(std::equal(again.begin(), again.end(), bytes.begin()));
          try {  // message decoders must also fail cleanly
            switch (f->type) {
              case MessageType::kMembership:
                (void)decode<Membership>(*f);
                break;
              case MessageType::kHello:
                (void)decode<Hello>(*f);
                break;
              case MessageType::kReject:
                (void)decode<Reject>(*f);
                break;
              default:
                (void)decode<Heartbeat>(*f);
                break;
            }
          } catch (const DataError&) {
          }
        }
      }
    } catch (const DataError&) {
      ++errors_seen;
    }
  }
  EXPECT_GT(errors_seen, 5000u);
  // CRC32C catches every 1-3 bit flip at these lengths, so only flips that cancel out leave
  // a valid frame.
  RecordProperty("frames_seen", static_cast<int>(frames_seen));
}

}  // namespace
}  // namespace desloc::transport
