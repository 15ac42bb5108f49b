// The wide-area shard map (shard_map.hpp).
#include "desloc/sync/shard_map.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "desloc/core/error.hpp"

namespace desloc::sync {

ShardMap ShardMap::even(int ranks) {
  if (ranks < 1) throw ConfigError("ranks per site must be >= 1, got " + std::to_string(ranks));
  ShardMap m;
  m.shards_ = ranks;
  m.bounds_.resize(static_cast<std::size_t>(ranks) + 1);
  std::iota(m.bounds_.begin(), m.bounds_.end(), 0);
  return m;
}

ShardMap::ShardMap(std::span<const int> site_ranks) {
  if (site_ranks.empty()) throw ConfigError("a shard map needs at least one site");
  long shards = 1;
  for (const int r : site_ranks) {
    if (r < 1) throw ConfigError("a site's rank count must be >= 1, got " + std::to_string(r));
    shards = std::lcm(shards, static_cast<long>(r));
    if (shards > kMaxShards)
      throw ConfigError("the sites' rank counts have a least common multiple past " +
                        std::to_string(kMaxShards) + " wide-area shards");
  }
  shards_ = static_cast<int>(shards);
  std::vector<int> bounds;
  for (const int r : site_ranks)
    for (int q = 0; q <= r; ++q) bounds.push_back(q * (shards_ / r));
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  bounds_ = std::move(bounds);
  const bool alike =
      std::all_of(site_ranks.begin(), site_ranks.end(), [&](int r) { return r == site_ranks[0]; });
  if (!alike) site_ranks_.assign(site_ranks.begin(), site_ranks.end());
}

int ShardMap::ranks_of(int site) const {
  if (site_ranks_.empty()) return shards_;
  return site_ranks_.at(static_cast<std::size_t>(site));
}

ShardMap ShardMap::subset(std::span<const int> sites) const {
  ShardMap m = *this;
  if (site_ranks_.empty()) return m;
  m.site_ranks_.clear();
  for (const int s : sites) m.site_ranks_.push_back(site_ranks_.at(static_cast<std::size_t>(s)));
  return m;
}

std::size_t ShardMap::offset(std::size_t n, int shard) const {
  // transport::block(n, shards_, shard).offset, for shard = shards_ too.
  const auto p = static_cast<std::size_t>(shards_);
  return std::min(n, static_cast<std::size_t>(shard) * ((n + p - 1) / p));
}

transport::Range ShardMap::segment(std::size_t n, int j) const {
  const std::size_t a = offset(n, bounds_.at(static_cast<std::size_t>(j)));
  const std::size_t b = offset(n, bounds_.at(static_cast<std::size_t>(j) + 1));
  return {a, b - a};
}

void ShardMap::check_ranks(int ranks) const {
  if (ranks < 1 || shards_ % ranks != 0)
    throw Error("shard map: a site of " + std::to_string(ranks) + " ranks in a map of " +
                std::to_string(shards_) + " shards");
}

ShardMap::Segments ShardMap::segments_of(int ranks, int rank) const {
  check_ranks(ranks);
  const int per = shards_ / ranks;
  const auto at = [&](int shard) {
    return static_cast<int>(std::lower_bound(bounds_.begin(), bounds_.end(), shard) -
                            bounds_.begin());
  };
  return {at(rank * per), at((rank + 1) * per)};
}

transport::Range ShardMap::owned(std::size_t n, int ranks, int rank) const {
  check_ranks(ranks);
  const int per = shards_ / ranks;
  const std::size_t a = offset(n, rank * per), b = offset(n, (rank + 1) * per);
  return {a, b - a};
}

std::size_t ShardMap::largest_owned(std::size_t n, int ranks) const {
  std::size_t most = 0;
  for (int q = 0; q < ranks; ++q) most = std::max(most, owned(n, ranks, q).count);
  return most;
}

int ShardMap::owner(int ranks, int j) const {
  check_ranks(ranks);
  return bounds_.at(static_cast<std::size_t>(j)) / (shards_ / ranks);
}

}  // namespace desloc::sync
