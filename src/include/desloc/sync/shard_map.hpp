// The wide-area shard map: which part of each state a rank of a site averages across sites.
//
// A state of n elements is cut into L wide-area shards (transport::block of L parts), L the
// least common multiple of the sites' rank counts, and rank q of a site of R ranks owns the
// contiguous shards [q L / R, (q + 1) L / R). Consecutive shards whose owners are the same in
// every site form one segment: the unit of a wide-area ring. Segment j's ring joins, in every
// site, the one rank that owns it, so a site with fewer ranks owns more segments per rank (and
// drives more rings, one after the other). For sites alike (R ranks each) the map is R
// segments, rank r owning segment r: transport::block(n, R, r), as before sites could differ.
// Pure arithmetic, shared by the in-process averagers (which sum segment by segment) and the
// networked ranks (which join one ring per segment they own), so both sum alike.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {

class ShardMap {
 public:
  // Sites alike, `ranks` each.
  static ShardMap even(int ranks);
  // Sites of these rank counts, in ring order (each >= 1). ConfigError past kMaxShards.
  explicit ShardMap(std::span<const int> site_ranks);

  static constexpr int kMaxShards = 1024;

  int shards() const { return shards_; }
  int segments() const { return static_cast<int>(bounds_.size()) - 1; }
  // Whether every site has the same rank count (one segment per rank).
  bool alike() const { return site_ranks_.empty(); }
  // Site s's rank count (every site's is shards() for an even map).
  int ranks_of(int site) const;
  int sites_known() const { return static_cast<int>(site_ranks_.size()); }
  // The map of a subset of the sites (regions): the same segments, those sites' rank counts.
  ShardMap subset(std::span<const int> sites) const;

  // Segment j's elements of an n-element state.
  transport::Range segment(std::size_t n, int j) const;
  // The segments rank `rank` of a site of `ranks` ranks owns: [first, last).
  struct Segments {
    int first = 0, last = 0;
  };
  Segments segments_of(int ranks, int rank) const;
  // The elements that rank owns: the union of its segments.
  transport::Range owned(std::size_t n, int ranks, int rank) const;
  // The most elements any rank of a site of `ranks` ranks owns (its all-gather's block).
  std::size_t largest_owned(std::size_t n, int ranks) const;
  // The rank of a site of `ranks` ranks that owns segment j.
  int owner(int ranks, int j) const;

 private:
  ShardMap() = default;
  std::size_t offset(std::size_t n, int shard) const;
  void check_ranks(int ranks) const;

  int shards_ = 1;
  std::vector<int> bounds_{0, 1};  // segment boundaries, in shards: 0 < ... < shards_
  std::vector<int> site_ranks_;    // empty: every site has shards_ ranks
};

}  // namespace desloc::sync
