// The arithmetic of the ring all-reduce, without any transport: how a buffer is cut into
// segments and in which order each element is summed. UcxCollective follows it, and the
// in-process reference (VirtualAverager in ring mode) replays it, so a multi-process run and
// the virtual-worker run of the same job agree bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <vector>

namespace desloc::transport {

// Element range [offset, offset + count) of segment `index` when `count` elements are split
// into `parts` near-equal contiguous segments (the first count % parts get one extra).
struct Range {
  std::size_t offset = 0;
  std::size_t count = 0;
};
constexpr Range segment(std::size_t count, int parts, int index) {
  const std::size_t base = count / static_cast<std::size_t>(parts);
  const std::size_t extra = count % static_cast<std::size_t>(parts);
  const auto i = static_cast<std::size_t>(index);
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

// Shard `index` of `count` elements cut into `parts` blocks of ceil(count / parts) (the last
// ones shorter or empty): the unit an all-gather of equal blocks reassembles. Rank r of every
// site owns shard r of each state buffer.
constexpr Range block(std::size_t count, int parts, int index) {
  const auto p = static_cast<std::size_t>(parts);
  const std::size_t size = (count + p - 1) / p;
  const std::size_t begin = std::min(count, static_cast<std::size_t>(index) * size);
  return {begin, std::min(count, begin + size) - begin};
}

// What a ring all_reduce_sum over inputs.size() ranks leaves in every rank's buffer, bit for
// bit: segment k's reduction starts at rank k, and each next rank in ring order adds its own
// value to the partial sum it received, in float: ((x_k + x_{k+1}) + x_{k+2}) + ... + x_{k-1}
// (float addition is commutative, so "mine + received" and "received + mine" agree).
// inputs[r] is rank r's buffer; all have out.size() elements. `out` may alias none of them.
inline void ring_sum_reference(std::span<const std::span<const float>> inputs,
                               std::span<float> out) {
  const int n = static_cast<int>(inputs.size());
  if (n == 0) throw std::invalid_argument("ring_sum_reference: no inputs");
  for (const auto& in : inputs)
    if (in.size() != out.size())
      throw std::invalid_argument("ring_sum_reference: inputs differ in length");
  for (int k = 0; k < n; ++k) {
    const Range seg = segment(out.size(), n, k);
    for (std::size_t i = seg.offset; i < seg.offset + seg.count; ++i) {
      float acc = inputs[static_cast<std::size_t>(k)][i];
      for (int j = 1; j < n; ++j) acc = inputs[static_cast<std::size_t>((k + j) % n)][i] + acc;
      out[i] = acc;
    }
  }
}

// Lanes. A ring sends on one direction of each link only; with two lanes a buffer's first part
// (lane_block(count, share, 0)) goes round the ring in site order and the rest round the
// reversed ring, so both directions of every link carry data. In the reversed ring, site s
// has group rank reversed_rank(s, n) (its successor is site s - 1).
constexpr int reversed_rank(int site, int n) { return (n - site) % n; }
// Two sites already use both directions of their one link; a second lane helps from three on.
constexpr int effective_lanes(int lanes, int sites) { return sites >= 3 && lanes >= 2 ? 2 : 1; }

// The split of `count` elements over the two lanes (transport.lane_share): the first
// ceil(count x share) go round the ring, the rest round the reversed ring. share = 0.5 is the
// even split, block(count, 2, lane). Where one direction of the rings is slower, a share in
// proportion to the two rings' capacity makes both lanes finish together (`desloc plan`).
inline Range lane_block(std::size_t count, double share, int lane) {
  const auto first =
      std::min(count, static_cast<std::size_t>(std::ceil(static_cast<double>(count) * share)));
  return lane == 0 ? Range{0, first} : Range{first, count - first};
}

// What lane-split ring all-reduces leave, bit for bit; inputs are indexed by site. lanes == 1
// is ring_sum_reference.
inline void lane_sum_reference(std::span<const std::span<const float>> inputs, std::span<float> out,
                               int lanes, double share = 0.5) {
  if (lanes <= 1) return ring_sum_reference(inputs, out);
  const int n = static_cast<int>(inputs.size());
  const Range first = lane_block(out.size(), share, 0), second = lane_block(out.size(), share, 1);
  std::vector<std::span<const float>> half(inputs.size());
  for (std::size_t s = 0; s < inputs.size(); ++s)
    half[s] = inputs[s].subspan(first.offset, first.count);
  ring_sum_reference(half, out.subspan(first.offset, first.count));
  for (int s = 0; s < n; ++s)
    half[static_cast<std::size_t>(reversed_rank(s, n))] =
        inputs[static_cast<std::size_t>(s)].subspan(second.offset, second.count);
  ring_sum_reference(half, out.subspan(second.offset, second.count));
}

}  // namespace desloc::transport
