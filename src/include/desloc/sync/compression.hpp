// Compressed state averages (issue 14): a state whose codec is not fp32 is averaged as the
// difference from a shared reference, quantised, with optional error feedback.
//
// Between two averages of a state every site starts from the same value, the last mean: the
// reference r, bit-identical on every site. A site sends d = s - r (+ e, its error-feedback
// buffer) encoded with the state's codec; the encoded payloads are summed along a ring (each
// site decodes, adds and re-encodes; see RingLayout) and every site takes
//     mean = r + (decoded sum of d) / kept,   r <- mean,   s <- mean,
// and, with error feedback, keeps e <- what quantisation dropped of its payload and of the
// sums it re-encoded on the way.
// The same bytes decode to the same floats everywhere, so the mean (and r) stay identical on
// every site, and the in-process averager equals the networked one bit for bit: both call
// the functions below, shard by shard, in the same order.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/codec.hpp"
#include "desloc/sync/payload_guard.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {

// [sync] codec_x / codec_u / codec_v, codec_block, error_feedback.
struct CompressionConfig {
  std::array<Codec, 4> codec{Codec::kFp32, Codec::kFp32, Codec::kFp32, Codec::kFp32};
  std::size_t block = kDefaultCodecBlock;
  bool error_feedback = false;
  // codec_v = "sqrt-<codec>": v travels as sqrt(v) (its reference is sqrt of the last mean).
  bool sqrt_v = false;

  Codec of(optim::StateKind k) const { return codec[static_cast<std::size_t>(k)]; }
  bool compresses(optim::StateKind k) const { return of(k) != Codec::kFp32; }
  bool any() const {
    for (const Codec c : codec)
      if (c != Codec::kFp32) return true;
    return false;
  }
};

// What one compressed average works on, for the replicas the averager is given: the
// reference's matching view (one, shared by every replica) and each replica's error-feedback
// view (empty without error feedback).
struct CodecViews {
  Codec codec = Codec::kFp32;
  std::size_t block = kDefaultCodecBlock;
  // The mean is clamped at zero (v: a quantised difference can overshoot a small positive
  // value, and Adam takes its square root).
  bool nonnegative = false;
  // The state travels as its square root (codec_v = "sqrt-..."): the reference holds sqrt of
  // the last mean, the sites' differences and feedback are of sqrt(state), and the mean is
  // the square of reference + sum / kept, the mean of the sites' sqrt(v) squared. Adam divides
  // by sqrt(v): a fixed error in sqrt(v) costs every element the same relative step, where a
  // fixed error in v lands on the small values of a block.
  bool sqrt_domain = false;
  std::span<float> reference;
  std::vector<std::span<float>> feedback;  // per replica, or empty
};

// The references and error-feedback buffers of a job's compressed states, for the replicas this
// process holds. Part of the training state: checkpointed, restored by --resume, rolled back
// with the rest after a failure; a rejoining site receives the references and starts with
// zero error feedback.
class CompressionState {
 public:
  CompressionState() = default;
  // `n` elements per state, `replicas` replicas held here.
  CompressionState(CompressionConfig cfg, std::size_t n, int replicas);

  const CompressionConfig& config() const { return cfg_; }
  bool active() const { return cfg_.any(); }
  // The start of a run: every site holds x0, u = v = 0, so those are the references; the
  // error feedback is zero.
  void reset(std::span<const float> x0);
  // Replicas held here (an elastic join adds some: their feedback starts at zero).
  void resize(int replicas);
  int replicas() const { return replicas_; }

  // Empty for a state that is not compressed (or without error feedback, for feedback()).
  std::vector<float>& reference(optim::StateKind k) { return ref_[idx(k)]; }
  const std::vector<float>& reference(optim::StateKind k) const { return ref_[idx(k)]; }
  std::vector<float>& feedback(optim::StateKind k, int replica);
  const std::vector<float>& feedback(optim::StateKind k, int replica) const;
  // Zeroes every replica's error feedback (a site that rejoins).
  void clear_feedback();

  // The views of block `fragment` of `fragments` (transport::block) for an average of k.
  CodecViews views(optim::StateKind k, int fragment, int fragments);

 private:
  static std::size_t idx(optim::StateKind k) { return static_cast<std::size_t>(k); }
  CompressionConfig cfg_;
  std::size_t n_ = 0;
  int replicas_ = 0;
  std::array<std::vector<float>, 4> ref_;
  std::array<std::vector<std::vector<float>>, 4> ef_;  // [kind][replica]
};

// What the planner and the simulator assume one compressed average costs a site in codec work:
// five passes over its shard (its own encoding, the decode-add-encode of the sums it relays,
// the final decode) at 3 GB/s of fp32 per core, about bench_codec's slowest codec here.
// bench_codec --ring measures the in-process ring's codec work against this price.
inline constexpr double kCodecPassesPerAverage = 5.0;
inline constexpr double kCodecBytesPerSecond = 3e9;
inline double codec_seconds_priced(double shard_floats) {
  return kCodecPassesPerAverage * 4.0 * shard_floats / kCodecBytesPerSecond;
}

// How one shard's compressed average lays out its bytes. It travels as a ring all-reduce of
// encoded bytes (transport::Collective::reduce_scatter_encoded, then an all-gather): the
// shard's m values are cut into one segment per site (transport::segment, as the fp32 ring
// cuts them), each segment into pieces of piece_elems values that are encoded on their own
// (the unit the transport pipelines), and every segment is padded with zeros to the largest.
// piece_elems is a multiple of the codec block fixed by the codec alone, so every rank of a
// job agrees on the layout whatever its link's chunk size.
struct RingLayout {
  RingLayout(const CodecViews& c, std::size_t m, int sites);
  Codec codec;
  std::size_t block;
  bool sqrt_domain;
  std::size_t m;
  int sites;
  std::size_t piece_elems;
  std::size_t piece_bytes;    // a whole piece, encoded
  std::size_t segment_bytes;  // the largest segment, encoded; every segment padded to it

  std::size_t pieces(int s) const;
  // Elements of piece c of segment s, relative to the shard (count 0 past the segment's end).
  transport::Range piece(int s, std::size_t c) const;
  std::size_t encoded(int s, std::size_t c) const;  // bytes of that piece
};

// The sum of the sites' encoded differences, segment s reduced along the ring from site s:
//  1. every site encodes d = state - reference (+ feedback), piece by piece, into its S
//     segments (encode_contribution), keeping feedback <- d - decode(encoded);
//  2. each next site on segment s's ring decodes what it received, adds its own decoded
//     piece, and re-encodes the sum in place of its own (combine_piece); what that
//     re-encoding dropped joins its feedback too, so no quantisation error is lost;
//  3. the last site's segment is the sum, which an all-gather gives everyone, and
//     finish_mean turns into reference + sum / kept on every site alike.
// Two encodings per value on the wire, 2 (S - 1) / S of the encoded bytes per site, and the
// same float operations in the same order in one process as over the network.

// `out` holds sites * segment_bytes bytes. A site the payload guard rejected (`zero`) sends
// zeros and its feedback restarts at zero. `feedback` is empty without error feedback. `scale`
// multiplies the difference before the feedback joins it (the site's weight in a weighted
// average, Averager::contribution_scales): the feedback holds what the weighted contribution
// dropped.
void encode_contribution(const RingLayout& l, std::span<const float> state,
                         std::span<const float> reference, std::span<float> feedback, bool zero,
                         std::span<std::byte> out, std::vector<float>& scratch, float scale = 1.0f);
// Piece c of segment s (`received` and `own` hold at least its encoded bytes; padding is left
// alone): own <- encode(decode(received) + decode(own)). `feedback` is the whole shard's (or
// empty).
void combine_piece(const RingLayout& l, int s, std::size_t c, std::span<const std::byte> received,
                   std::span<std::byte> own, std::span<float> feedback,
                   std::vector<float>& scratch);
// `combined` holds every segment's sum, segment s at s * segment_bytes: reference <- reference
// + sum / kept (at least 0 when c.nonnegative), and `mean` receives it (it may be the state).
// In the sqrt domain, r = max(0, reference + sum / kept), mean = r * r and reference <-
// sqrt(mean), so that the reference is always what set_reference makes of the mean.
void finish_mean(const RingLayout& l, const CodecViews& c, std::span<const std::byte> combined,
                 int kept, std::span<float> reference, std::span<float> mean,
                 std::vector<float>& scratch);

// The payload guard's figures of what a site's shard sends, decoded: reference + decode(encode(
// state - reference + feedback)), squared in the sqrt domain, piece by piece as
// encode_contribution encodes it (the feedback untouched). A non-finite value poisons its
// codec block, so the whole block counts as non-finite.
PayloadHealth measure_decoded(const RingLayout& l, std::span<const float> state,
                              std::span<const float> reference, std::span<const float> feedback,
                              std::vector<float>& scratch);

// The guard's figures of replica `replica`'s block b (`shard`, its values) of a state averaged
// over `sites`: measure_payload of the values, or for a compressed state (a codec with a
// reference) measure_decoded of what the block sends, with that replica's feedback.
PayloadHealth measure_sent(const CodecViews* codec, std::size_t replica, transport::Range b,
                           std::span<const float> shard, int sites, std::vector<float>& scratch);

// reference <- the reference a mean makes: the mean itself, or in the sqrt domain its square
// root. Where a whole mean is known but only part of it came through finish_mean (one site;
// a site's ranks sharing their shards), every rank takes the reference from the mean alike.
void set_reference(const CodecViews& c, std::span<const float> mean, std::span<float> reference);

}  // namespace desloc::sync
