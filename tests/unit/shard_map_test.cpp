// The wide-area shard map: segments of sites whose rank counts differ, and the even map of sites
// alike (which must stay transport::block, the layout before sites could differ).
#include <gtest/gtest.h>

#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/sync/shard_map.hpp"
#include "desloc/transport/ring_order.hpp"

using desloc::ConfigError;
using desloc::sync::ShardMap;

TEST(ShardMap, EvenMapIsTheBlockOfEachRank) {
  for (const int R : {1, 2, 3, 5})
    for (const std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1003}}) {
      const ShardMap even = ShardMap::even(R);
      const ShardMap alike(std::vector<int>(3, R));
      EXPECT_TRUE(alike.alike());
      ASSERT_EQ(even.segments(), R);
      ASSERT_EQ(alike.segments(), R);
      for (int r = 0; r < R; ++r) {
        const desloc::transport::Range b = desloc::transport::block(n, R, r);
        for (const ShardMap* m : {&even, &alike}) {
          EXPECT_EQ(m->segment(n, r).offset, b.offset);
          EXPECT_EQ(m->segment(n, r).count, b.count);
          EXPECT_EQ(m->owned(n, R, r).count, b.count);
          EXPECT_EQ(m->segments_of(R, r).first, r);
          EXPECT_EQ(m->segments_of(R, r).last, r + 1);
          EXPECT_EQ(m->owner(R, r), r);
        }
      }
    }
}

TEST(ShardMap, SitesOfOneTwoAndThreeRanks) {
  const ShardMap m(std::vector<int>{1, 2, 3});
  EXPECT_FALSE(m.alike());
  EXPECT_EQ(m.shards(), 6);
  // Boundaries at every multiple of 6 / R: {0, 2, 3, 4, 6}.
  ASSERT_EQ(m.segments(), 4);
  EXPECT_EQ(m.segments_of(1, 0).first, 0);
  EXPECT_EQ(m.segments_of(1, 0).last, 4);
  EXPECT_EQ(m.segments_of(2, 0).last, 2);
  EXPECT_EQ(m.segments_of(2, 1).first, 2);
  EXPECT_EQ(m.segments_of(3, 1).first, 1);
  EXPECT_EQ(m.segments_of(3, 1).last, 3);
  EXPECT_EQ(m.owner(3, 2), 1);  // segment 2 is shard 3, the second third
  EXPECT_EQ(m.owner(2, 2), 1);
  EXPECT_EQ(m.owner(1, 3), 0);
  EXPECT_EQ(m.ranks_of(2), 3);
  // The segments cut [0, n) without gap or overlap, and each rank's range is its segments'.
  for (const std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{601}}) {
    std::size_t at = 0;
    for (int j = 0; j < m.segments(); ++j) {
      EXPECT_EQ(m.segment(n, j).offset, at);
      at += m.segment(n, j).count;
    }
    EXPECT_EQ(at, n);
    for (const int R : {1, 2, 3})
      for (int q = 0; q < R; ++q) {
        const ShardMap::Segments s = m.segments_of(R, q);
        const desloc::transport::Range owned = m.owned(n, R, q);
        EXPECT_EQ(owned.offset, m.segment(n, s.first).offset);
        EXPECT_EQ(owned.offset + owned.count,
                  m.segment(n, s.last - 1).offset + m.segment(n, s.last - 1).count);
      }
  }
  EXPECT_EQ(m.largest_owned(600, 1), 600u);
  EXPECT_EQ(m.largest_owned(600, 3), 200u);
  const std::vector<int> two_sites{0, 2};
  EXPECT_EQ(m.subset(two_sites).ranks_of(1), 3);
}

TEST(ShardMap, RefusesTooManyShardsAndBadCounts) {
  EXPECT_THROW(ShardMap(std::vector<int>{7, 11, 13, 2}), ConfigError);  // lcm 2002
  EXPECT_THROW(ShardMap(std::vector<int>{2, 0}), ConfigError);
  EXPECT_THROW(ShardMap::even(0), ConfigError);
  const ShardMap m(std::vector<int>{2, 3});
  EXPECT_THROW(m.segments_of(4, 0), desloc::Error);  // 4 does not divide 6
}
