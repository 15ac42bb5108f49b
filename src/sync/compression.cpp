// Compressed state averages: the shared references, the error feedback, and the per-shard
// arithmetic both averagers use (compression.hpp).
#include "desloc/sync/compression.hpp"

#include <algorithm>

#include "desloc/core/error.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {

bool CompressionConfig::any() const {
  return std::any_of(codec.begin(), codec.end(), [](Codec c) { return c != Codec::kFp32; });
}

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
  std::vector<float>& ref = ref_[idx(k)];
  if (ref.empty()) return v;
  const transport::Range b = transport::block(ref.size(), fragments, fragment);
  v.reference = std::span<float>(ref).subspan(b.offset, b.count);
  for (auto& e : ef_[idx(k)]) v.feedback.push_back(std::span<float>(e).subspan(b.offset, b.count));
  return v;
}

void compress_shard(const CodecViews& c, std::span<const float> state,
                    std::span<const float> reference, std::span<float> feedback,
                    std::span<std::byte> out, std::vector<float>& scratch) {
  const std::size_t n = state.size();
  if (reference.size() != n || (!feedback.empty() && feedback.size() != n))
    throw Error("compression: a shard of " + std::to_string(n) + " values has a reference of " +
                std::to_string(reference.size()) + " and feedback of " +
                std::to_string(feedback.size()));
  scratch.resize(n);
  float* d = scratch.data();
  if (feedback.empty()) {
    for (std::size_t i = 0; i < n; ++i) d[i] = state[i] - reference[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) d[i] = (state[i] - reference[i]) + feedback[i];
  }
  encode(c.codec, scratch, out, c.block);
  if (feedback.empty()) return;
  decode(c.codec, out, feedback, c.block);
  for (std::size_t i = 0; i < n; ++i) feedback[i] = d[i] - feedback[i];
}

void reduce_shard(const CodecViews& c, std::span<const std::span<const std::byte>> payloads,
                  std::span<const char> kept, std::span<float> reference, std::span<float> mean,
                  std::vector<float>& scratch) {
  const std::size_t n = mean.size();
  if (reference.size() != n || kept.size() != payloads.size())
    throw Error("compression: reducing a shard of " + std::to_string(n) + " values with a " +
                std::to_string(reference.size()) + "-value reference and " +
                std::to_string(kept.size()) + " verdicts for " + std::to_string(payloads.size()) +
                " payloads");
  scratch.resize(n);
  std::fill(mean.begin(), mean.end(), 0.0f);
  int sites = 0;
  for (std::size_t s = 0; s < payloads.size(); ++s) {
    if (!kept[s]) continue;
    ++sites;
    decode(c.codec, payloads[s], scratch, c.block);
    for (std::size_t i = 0; i < n; ++i) mean[i] += scratch[i];
  }
  if (sites == 0) throw Error("compression: every site's payload was left out");
  const auto m = static_cast<float>(sites);
  if (c.nonnegative) {
    for (std::size_t i = 0; i < n; ++i) mean[i] = std::max(0.0f, reference[i] + mean[i] / m);
  } else {
    for (std::size_t i = 0; i < n; ++i) mean[i] = reference[i] + mean[i] / m;
  }
  std::copy(mean.begin(), mean.end(), reference.begin());
}

}  // namespace desloc::sync
