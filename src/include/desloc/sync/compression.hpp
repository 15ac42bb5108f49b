// Compressed state averages (issue 14): a state whose codec is not fp32 is averaged as the
// difference from a shared reference, quantised, with optional error feedback.
//
// Between two averages of a state every site starts from the same value, the last mean: the
// reference r, bit-identical on every site. A site sends d = s - r (+ e, its error-feedback
// buffer) encoded with the state's codec; every site decodes every site's payload, sums them
// in site order and takes
//     mean = r + (sum of decoded d) / kept,   r <- mean,   s <- mean,
// and, with error feedback, keeps e <- d - decode(encode(d)), the part quantisation dropped.
// The same bytes decode to the same floats everywhere, so the mean (and r) stay identical on
// every site, and the in-process averager equals the networked one bit for bit: both call
// compress_shard and reduce_shard below, shard by shard.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/codec.hpp"

namespace desloc::sync {

// [sync] codec_x / codec_u / codec_v, codec_block, error_feedback.
struct CompressionConfig {
  std::array<Codec, 4> codec{Codec::kFp32, Codec::kFp32, Codec::kFp32, Codec::kFp32};
  std::size_t block = kDefaultCodecBlock;
  bool error_feedback = false;

  Codec of(optim::StateKind k) const { return codec[static_cast<std::size_t>(k)]; }
  bool compresses(optim::StateKind k) const { return of(k) != Codec::kFp32; }
  bool any() const;
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

// One site's payload for one shard: d = state - reference (+ feedback), encoded into `out`
// (encoded_bytes(codec, n, block) bytes). With feedback (not empty), feedback <- d -
// decode(out). `scratch` is resized as needed.
void compress_shard(const CodecViews& c, std::span<const float> state,
                    std::span<const float> reference, std::span<float> feedback,
                    std::span<std::byte> out, std::vector<float>& scratch);
// The mean of the kept sites' payloads (`payloads[s]`, in site order; `kept[s]` false for a
// site the payload guard left out), added to the reference: reference <- reference + sum /
// kept (at least 0 when c.nonnegative), and `mean` receives it. Sums in float in site order,
// then divides once.
void reduce_shard(const CodecViews& c, std::span<const std::span<const std::byte>> payloads,
                  std::span<const char> kept, std::span<float> reference, std::span<float> mean,
                  std::vector<float>& scratch);

}  // namespace desloc::sync
