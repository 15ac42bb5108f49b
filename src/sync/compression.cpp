// Compressed state averages: the shared references, the error feedback, and the per-shard
// arithmetic both averagers use (compression.hpp).
#include "desloc/sync/compression.hpp"

#include <algorithm>
#include <cmath>

#include "desloc/core/error.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {

CompressionState::CompressionState(CompressionConfig cfg, std::size_t n, int replicas)
    : cfg_(cfg), n_(n) {
  for (const optim::StateKind k :
       {optim::StateKind::kX, optim::StateKind::kU, optim::StateKind::kV})
    if (cfg_.compresses(k)) ref_[idx(k)].assign(n_, 0.0f);
  resize(replicas);
}

void CompressionState::reset(std::span<const float> x0) {
  for (std::size_t k = 0; k < ref_.size(); ++k) {
    std::fill(ref_[k].begin(), ref_[k].end(), 0.0f);
    for (auto& e : ef_[k]) std::fill(e.begin(), e.end(), 0.0f);
  }
  std::vector<float>& rx = ref_[idx(optim::StateKind::kX)];
  if (!rx.empty()) {
    if (x0.size() != rx.size())
      throw Error("compression: the start's parameters hold " + std::to_string(x0.size()) +
                  " values, the reference " + std::to_string(rx.size()));
    std::copy(x0.begin(), x0.end(), rx.begin());
  }
}

void CompressionState::resize(int replicas) {
  replicas_ = replicas;
  for (std::size_t k = 0; k < ef_.size(); ++k)
    ef_[k].resize(cfg_.error_feedback && !ref_[k].empty() ? static_cast<std::size_t>(replicas) : 0,
                  std::vector<float>(n_, 0.0f));
}

std::vector<float>& CompressionState::feedback(optim::StateKind k, int replica) {
  return ef_[idx(k)].at(static_cast<std::size_t>(replica));
}

const std::vector<float>& CompressionState::feedback(optim::StateKind k, int replica) const {
  return ef_[idx(k)].at(static_cast<std::size_t>(replica));
}

void CompressionState::clear_feedback() {
  for (auto& per_kind : ef_)
    for (auto& e : per_kind) std::fill(e.begin(), e.end(), 0.0f);
}

CodecViews CompressionState::views(optim::StateKind k, int fragment, int fragments) {
  CodecViews v;
  v.codec = cfg_.of(k);
  v.block = cfg_.block;
  v.nonnegative = k == optim::StateKind::kV;
  v.sqrt_domain = k == optim::StateKind::kV && cfg_.sqrt_v;
  std::vector<float>& ref = ref_[idx(k)];
  if (ref.empty()) return v;
  const transport::Range b = transport::block(ref.size(), fragments, fragment);
  v.reference = std::span<float>(ref).subspan(b.offset, b.count);
  for (auto& e : ef_[idx(k)]) v.feedback.push_back(std::span<float>(e).subspan(b.offset, b.count));
  return v;
}

namespace {
// Values per encoded piece: about 64 Ki, a whole number of codec blocks.
constexpr std::size_t kPieceTarget = std::size_t(1) << 16;

// What a site sends before encoding: state - reference (+ feedback), of sqrt(state) in the
// sqrt domain.
void difference(const RingLayout& l, std::span<const float> state, std::span<const float> reference,
                std::span<const float> feedback, float* d, float scale = 1.0f) {
  if (l.sqrt_domain) {
    for (std::size_t i = 0; i < l.m; ++i) d[i] = std::sqrt(std::max(0.0f, state[i])) - reference[i];
  } else {
    for (std::size_t i = 0; i < l.m; ++i) d[i] = state[i] - reference[i];
  }
  if (scale != 1.0f)
    for (std::size_t i = 0; i < l.m; ++i) d[i] *= scale;
  if (!feedback.empty())
    for (std::size_t i = 0; i < l.m; ++i) d[i] += feedback[i];
}
}  // namespace

RingLayout::RingLayout(const CodecViews& c, std::size_t m_, int sites_)
    : codec(c.codec), block(c.block), sqrt_domain(c.sqrt_domain), m(m_), sites(sites_) {
  piece_elems = (kPieceTarget + block - 1) / block * block;
  piece_bytes = encoded_bytes(codec, piece_elems, block);
  segment_bytes = 0;
  for (int s = 0; s < sites; ++s) {
    std::size_t bytes = 0;
    for (std::size_t p = 0; p < pieces(s); ++p) bytes += encoded(s, p);
    segment_bytes = std::max(segment_bytes, bytes);
  }
}

std::size_t RingLayout::pieces(int s) const {
  const std::size_t n = transport::segment(m, sites, s).count;
  return (n + piece_elems - 1) / piece_elems;
}

transport::Range RingLayout::piece(int s, std::size_t c) const {
  const transport::Range seg = transport::segment(m, sites, s);
  const std::size_t lo = std::min(seg.count, c * piece_elems);
  return {seg.offset + lo, std::min(seg.count - lo, piece_elems)};
}

std::size_t RingLayout::encoded(int s, std::size_t c) const {
  const std::size_t n = piece(s, c).count;
  return n == 0 ? 0 : encoded_bytes(codec, n, block);
}

void encode_contribution(const RingLayout& l, std::span<const float> state,
                         std::span<const float> reference, std::span<float> feedback, bool zero,
                         std::span<std::byte> out, std::vector<float>& scratch, float scale) {
  if (state.size() != l.m || reference.size() != l.m ||
      (!feedback.empty() && feedback.size() != l.m) ||
      out.size() != l.segment_bytes * static_cast<std::size_t>(l.sites))
    throw Error("compression: a shard of " + std::to_string(l.m) + " values got a state of " +
                std::to_string(state.size()) + ", a reference of " +
                std::to_string(reference.size()) + ", feedback of " +
                std::to_string(feedback.size()) + " and " + std::to_string(out.size()) +
                " bytes for its payload");
  std::fill(out.begin(), out.end(), std::byte{0});
  if (zero) {  // encoded zeros decode to zeros; what this site dropped before starts over
    std::fill(feedback.begin(), feedback.end(), 0.0f);
    return;
  }
  scratch.resize(l.m);
  float* d = scratch.data();
  difference(l, state, reference, feedback, d, scale);
  for (int s = 0; s < l.sites; ++s) {
    std::size_t at = static_cast<std::size_t>(s) * l.segment_bytes;
    for (std::size_t c = 0; c < l.pieces(s); ++c) {
      const transport::Range r = l.piece(s, c);
      const std::span<std::byte> bytes = out.subspan(at, l.encoded(s, c));
      encode(l.codec, std::span<const float>(scratch).subspan(r.offset, r.count), bytes, l.block);
      at += bytes.size();
      if (feedback.empty()) continue;
      const std::span<float> e = feedback.subspan(r.offset, r.count);
      decode(l.codec, bytes, e, l.block);
      for (std::size_t i = 0; i < r.count; ++i) e[i] = d[r.offset + i] - e[i];
    }
  }
}

void combine_piece(const RingLayout& l, int s, std::size_t c, std::span<const std::byte> received,
                   std::span<std::byte> own, std::span<float> feedback,
                   std::vector<float>& scratch) {
  const transport::Range r = l.piece(s, c);
  if (r.count == 0) return;  // padding
  const std::size_t bytes = l.encoded(s, c);
  if (received.size() < bytes || own.size() < bytes ||
      (!feedback.empty() && feedback.size() != l.m))
    throw Error("compression: piece " + std::to_string(c) + " of segment " + std::to_string(s) +
                " needs " + std::to_string(bytes) + " bytes, got " +
                std::to_string(received.size()) + " and " + std::to_string(own.size()));
  scratch.resize(2 * r.count);
  const std::span<float> sum = std::span<float>(scratch).first(r.count);
  const std::span<float> mine = std::span<float>(scratch).subspan(r.count, r.count);
  decode(l.codec, received.first(bytes), sum, l.block);
  decode(l.codec, own.first(bytes), mine, l.block);
  for (std::size_t i = 0; i < r.count; ++i) sum[i] = sum[i] + mine[i];
  encode(l.codec, sum, own.first(bytes), l.block);
  if (feedback.empty()) return;
  decode(l.codec, own.first(bytes), mine, l.block);
  const std::span<float> e = feedback.subspan(r.offset, r.count);
  for (std::size_t i = 0; i < r.count; ++i) e[i] += sum[i] - mine[i];
}

void finish_mean(const RingLayout& l, const CodecViews& c, std::span<const std::byte> combined,
                 int kept, std::span<float> reference, std::span<float> mean,
                 std::vector<float>& scratch) {
  if (reference.size() != l.m || mean.size() != l.m ||
      combined.size() != l.segment_bytes * static_cast<std::size_t>(l.sites))
    throw Error("compression: finishing a shard of " + std::to_string(l.m) + " values with a " +
                std::to_string(reference.size()) + "-value reference and " +
                std::to_string(combined.size()) + " bytes");
  if (kept < 1) throw Error("compression: every site's payload was left out");
  const auto k = static_cast<float>(kept);
  for (int s = 0; s < l.sites; ++s) {
    std::size_t at = static_cast<std::size_t>(s) * l.segment_bytes;
    for (std::size_t p = 0; p < l.pieces(s); ++p) {
      const transport::Range r = l.piece(s, p);
      scratch.resize(r.count);
      decode(l.codec, combined.subspan(at, l.encoded(s, p)), scratch, l.block);
      at += l.encoded(s, p);
      if (c.sqrt_domain) {
        for (std::size_t i = 0; i < r.count; ++i) {
          const float root = std::max(0.0f, reference[r.offset + i] + scratch[i] / k);
          const float v = root * root;
          reference[r.offset + i] = std::sqrt(v);
          mean[r.offset + i] = v;
        }
        continue;
      }
      for (std::size_t i = 0; i < r.count; ++i) {
        float v = reference[r.offset + i] + scratch[i] / k;
        if (c.nonnegative) v = std::max(0.0f, v);
        reference[r.offset + i] = v;
        mean[r.offset + i] = v;
      }
    }
  }
}

PayloadHealth measure_decoded(const RingLayout& l, std::span<const float> state,
                              std::span<const float> reference, std::span<const float> feedback,
                              std::vector<float>& scratch) {
  if (state.size() != l.m || reference.size() != l.m ||
      (!feedback.empty() && feedback.size() != l.m))
    throw Error("compression: judging a shard of " + std::to_string(l.m) +
                " values with a state of " + std::to_string(state.size()) + ", a reference of " +
                std::to_string(reference.size()) + " and feedback of " +
                std::to_string(feedback.size()));
  // The differences, the decoded values and one encoded piece, in one buffer the caller keeps.
  scratch.resize(2 * l.m + (l.piece_bytes + sizeof(float) - 1) / sizeof(float));
  float* d = scratch.data();
  float* sent = scratch.data() + l.m;
  const std::span<std::byte> bytes =
      std::as_writable_bytes(std::span<float>(scratch).subspan(2 * l.m));
  difference(l, state, reference, feedback, d);
  for (int s = 0; s < l.sites; ++s)
    for (std::size_t c = 0; c < l.pieces(s); ++c) {
      const transport::Range r = l.piece(s, c);
      const std::span<std::byte> enc = bytes.first(l.encoded(s, c));
      encode(l.codec, std::span<const float>(d + r.offset, r.count), enc, l.block);
      decode(l.codec, enc, std::span<float>(sent + r.offset, r.count), l.block);
    }
  for (std::size_t i = 0; i < l.m; ++i) {
    const float v = reference[i] + sent[i];
    sent[i] = l.sqrt_domain ? v * v : v;
  }
  return measure_payload(std::span<const float>(sent, l.m));
}

PayloadHealth measure_sent(const CodecViews* codec, std::size_t replica, transport::Range b,
                           std::span<const float> shard, int sites, std::vector<float>& scratch) {
  if (codec == nullptr || codec->reference.empty()) return measure_payload(shard);
  const std::span<const float> fb = codec->feedback.empty()
                                        ? std::span<const float>()
                                        : codec->feedback.at(replica).subspan(b.offset, b.count);
  return measure_decoded(RingLayout(*codec, b.count, sites), shard,
                         codec->reference.subspan(b.offset, b.count), fb, scratch);
}

void set_reference(const CodecViews& c, std::span<const float> mean, std::span<float> reference) {
  if (reference.size() != mean.size())
    throw Error("compression: a reference of " + std::to_string(reference.size()) +
                " values for a mean of " + std::to_string(mean.size()));
  if (!c.sqrt_domain) {
    std::copy(mean.begin(), mean.end(), reference.begin());
    return;
  }
  for (std::size_t i = 0; i < mean.size(); ++i) reference[i] = std::sqrt(std::max(0.0f, mean[i]));
}

}  // namespace desloc::sync
