// Tests of DataLoader and EvalLoader on synthetic shards whose token i is the number i, so a
// batch's values say exactly which windows it holds.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/data/loader.hpp"
#include "desloc/data/shard.hpp"
#include "temp_dir_test.hpp"

namespace desloc::data {
namespace {
namespace fs = std::filesystem;

constexpr std::uint32_t kVocab = 65536;
// Worker 0's first four windows of 100 for seed 1234, epoch 0 (see PermutationIsPinned);
// reproduced independently by a Python transcription of splitmix64 + xoshiro256** +
// Fisher-Yates as documented in loader.hpp.
constexpr std::int64_t kPinned[4] = {45, 99, 61, 62};

class LoaderTest : public test_support::TempDirTest {
 protected:
  // A dataset whose training stream is 0, 1, ..., train_tokens-1 split over `shards` files,
  // and whose validation stream is 50000, 50001, ...
  DatasetInfo make_dataset(std::uint32_t train_tokens, int shards, std::uint32_t val_tokens) {
    DatasetInfo info;
    info.vocab = kVocab;
    std::vector<std::uint16_t> all(train_tokens);
    for (std::uint32_t i = 0; i < train_tokens; ++i) all[i] = static_cast<std::uint16_t>(i);
    const std::uint32_t per = (train_tokens + shards - 1) / static_cast<std::uint32_t>(shards);
    for (int s = 0; s < shards; ++s) {
      const std::uint32_t begin = std::min(train_tokens, per * static_cast<std::uint32_t>(s));
      const std::uint32_t end = std::min(train_tokens, begin + per);
      const std::string p = (dir_ / ("train_" + std::to_string(s) + ".bin")).string();
      write_shard(p, std::span(all).subspan(begin, end - begin), kVocab);
      info.train_shards.push_back(p);
    }
    std::vector<std::uint16_t> val(val_tokens);
    for (std::uint32_t i = 0; i < val_tokens; ++i) val[i] = static_cast<std::uint16_t>(50000 + i);
    info.val_shard = (dir_ / "val.bin").string();
    write_shard(info.val_shard, val, kVocab);
    info.train_tokens = train_tokens;
    info.val_tokens = val_tokens;
    return info;
  }
};

struct Batch {
  std::vector<std::int32_t> x, y;
  bool operator==(const Batch&) const = default;
};

Batch next_batch(DataLoader& loader, int B, int T) {
  Batch b{std::vector<std::int32_t>(static_cast<std::size_t>(B * T)),
          std::vector<std::int32_t>(static_cast<std::size_t>(B * T))};
  loader.next(b.x, b.y);
  return b;
}

// The window index of each row (inputs start at token window*T, and token i has value i).
std::vector<std::int64_t> windows_of(const Batch& b, int B, int T) {
  std::vector<std::int64_t> w;
  for (int r = 0; r < B; ++r) {
    EXPECT_EQ(b.x[static_cast<std::size_t>(r * T)] % T, 0);
    w.push_back(b.x[static_cast<std::size_t>(r * T)] / T);
  }
  return w;
}

TEST_F(LoaderTest, TargetsAreInputsShiftedByOne) {
  const int B = 3, T = 7;
  const DatasetInfo data = make_dataset(1000, 3, 100);
  DataLoader loader(data, B, T, 42, 0, 1);
  for (int step = 0; step < 20; ++step) {
    const Batch b = next_batch(loader, B, T);
    for (int r = 0; r < B; ++r) {
      for (int t = 0; t < T; ++t) {
        const auto i = static_cast<std::size_t>(r * T + t);
        EXPECT_EQ(b.y[i], b.x[i] + 1);  // consecutive tokens, also across shard boundaries
        if (t + 1 < T) {
          EXPECT_EQ(b.y[i], b.x[i + 1]);
        }
      }
    }
  }
}

TEST_F(LoaderTest, SameSeedSameBatchesOtherSeedOtherBatches) {
  const int B = 4, T = 8;
  const DatasetInfo data = make_dataset(2000, 2, 100);
  DataLoader a(data, B, T, 7, 1, 2), b(data, B, T, 7, 1, 2), c(data, B, T, 8, 1, 2);
  bool differs = false;
  for (int step = 0; step < 100; ++step) {  // several epochs
    const Batch ba = next_batch(a, B, T);
    EXPECT_EQ(ba, next_batch(b, B, T)) << "step " << step;
    differs |= !(ba == next_batch(c, B, T));
  }
  EXPECT_TRUE(differs);
}

// Pins the permutation, so a change to the PRNG or shuffle (which would silently change
// every resumed run's data order) fails here.
TEST_F(LoaderTest, PermutationIsPinned) {
  const int B = 4, T = 10;
  const DatasetInfo data = make_dataset(1001, 1, 100);  // 100 windows
  DataLoader loader(data, B, T, 1234, 0, 1);
  const Batch b = next_batch(loader, B, T);
  const auto w = windows_of(b, B, T);
  EXPECT_EQ(w, (std::vector<std::int64_t>{kPinned[0], kPinned[1], kPinned[2], kPinned[3]}));
}

class LoaderWorkersTest : public LoaderTest, public ::testing::WithParamInterface<int> {};

// N workers over one epoch take disjoint windows whose union is every window of the epoch.
TEST_P(LoaderWorkersTest, WorkersPartitionTheEpoch) {
  const int N = GetParam(), B = 2, T = 8;
  const std::int64_t windows = 12 * N;  // divisible by N * B: no window is skipped
  const DatasetInfo data = make_dataset(static_cast<std::uint32_t>(windows * T + 1), 2, 100);
  std::set<std::int64_t> seen;
  std::size_t taken = 0;
  for (int w = 0; w < N; ++w) {
    DataLoader loader(data, B, T, 99, w, N);
    ASSERT_EQ(loader.windows_per_epoch(), 12u);
    ASSERT_EQ(loader.batches_per_epoch(), 6u);
    for (std::uint64_t s = 0; s < loader.batches_per_epoch(); ++s) {
      for (auto win : windows_of(next_batch(loader, B, T), B, T)) {
        EXPECT_TRUE(seen.insert(win).second) << "window " << win << " taken twice";
        ++taken;
      }
    }
    EXPECT_EQ(loader.state().epoch, 0u);
    next_batch(loader, B, T);
    EXPECT_EQ(loader.state().epoch, 1u);
    EXPECT_EQ(loader.state().cursor, static_cast<std::uint64_t>(B));
  }
  EXPECT_EQ(taken, static_cast<std::size_t>(windows));
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(windows));
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), windows - 1);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LoaderWorkersTest, ::testing::Values(1, 2, 3, 5));

TEST_F(LoaderTest, UnevenWindowsStayDisjoint) {
  const int N = 3, B = 2, T = 5;
  const DatasetInfo data = make_dataset(64 * T + 1, 1, 100);  // 64 windows: 21 per worker
  std::set<std::int64_t> seen;
  for (int w = 0; w < N; ++w) {
    DataLoader loader(data, B, T, 5, w, N);
    EXPECT_EQ(loader.windows_per_epoch(), 20u);  // a multiple of B
    for (int s = 0; s < 10; ++s)
      for (auto win : windows_of(next_batch(loader, B, T), B, T))
        EXPECT_TRUE(seen.insert(win).second);
  }
  EXPECT_EQ(seen.size(), 60u);
}

TEST_F(LoaderTest, EpochsUseDifferentOrders) {
  const int B = 5, T = 4;
  const DatasetInfo data = make_dataset(100 * T + 1, 1, 100);
  DataLoader loader(data, B, T, 3, 0, 1);
  std::vector<std::int64_t> e0, e1;
  for (int s = 0; s < 20; ++s)
    for (auto w : windows_of(next_batch(loader, B, T), B, T)) e0.push_back(w);
  for (int s = 0; s < 20; ++s)
    for (auto w : windows_of(next_batch(loader, B, T), B, T)) e1.push_back(w);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(std::set<std::int64_t>(e0.begin(), e0.end()).size(), 100u);
  EXPECT_EQ(std::set<std::int64_t>(e1.begin(), e1.end()).size(), 100u);
}

TEST_F(LoaderTest, RestoreReproducesTheFollowingBatches) {
  const int B = 3, T = 6;
  const DatasetInfo data = make_dataset(500, 2, 100);  // 83 windows, 2 workers: 39 each
  for (int saved_after : {0, 5, 13, 14, 40}) {         // mid-epoch, at an epoch's end, later epochs
    DataLoader a(data, B, T, 11, 1, 2);
    for (int s = 0; s < saved_after; ++s) next_batch(a, B, T);
    const LoaderState state = a.state();
    std::vector<Batch> expected;
    for (int s = 0; s < 30; ++s) expected.push_back(next_batch(a, B, T));

    DataLoader b(data, B, T, 11, 1, 2);
    next_batch(b, B, T);  // restore must also work on a loader that has moved on
    b.restore(state);
    EXPECT_EQ(b.state().epoch, state.epoch);
    EXPECT_EQ(b.state().cursor, state.cursor);
    for (int s = 0; s < 30; ++s)
      ASSERT_EQ(next_batch(b, B, T), expected[static_cast<std::size_t>(s)])
          << "saved after " << saved_after << ", batch " << s;
  }
}

TEST_F(LoaderTest, BadArgumentsAndState) {
  const DatasetInfo data = make_dataset(100, 1, 50);
  EXPECT_THROW(DataLoader(data, 0, 4, 1, 0, 1), ConfigError);
  EXPECT_THROW(DataLoader(data, 2, 0, 1, 0, 1), ConfigError);
  EXPECT_THROW(DataLoader(data, 2, 4, 1, 2, 2), ConfigError);
  EXPECT_THROW(DataLoader(data, 2, 4, 1, -1, 2), ConfigError);
  try {
    DataLoader(data, 8, 16, 1, 0, 2);  // 6 windows cannot give 2 workers 8 each
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("too few for one batch"), std::string::npos) << e.what();
  }
  DataLoader loader(data, 2, 4, 1, 0, 1);
  std::vector<std::int32_t> x(8), y(8), small(7);
  EXPECT_THROW(loader.next(small, y), Error);
  EXPECT_THROW(loader.restore({0, loader.windows_per_epoch() + 1}), DataError);
}

TEST_F(LoaderTest, ShardVocabMustMatchDataset) {
  DatasetInfo data = make_dataset(100, 1, 50);
  data.vocab = 256;
  try {
    DataLoader(data, 2, 4, 1, 0, 1);
    ADD_FAILURE() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(data.train_shards[0]), std::string::npos) << e.what();
  }
  data.train_shards.push_back((dir_ / "missing.bin").string());
  data.vocab = kVocab;
  EXPECT_THROW(DataLoader(data, 2, 4, 1, 0, 1), DataError);
}

TEST_F(LoaderTest, EvalBatchesAreFixed) {
  const int B = 2, T = 5;
  const DatasetInfo data = make_dataset(100, 1, 53);  // 10 windows -> 5 batches
  const EvalLoader eval(data, B, T);
  ASSERT_EQ(eval.num_batches(), 5u);
  std::vector<std::int32_t> x(10), y(10), x2(10), y2(10);
  for (std::uint64_t i : {3u, 0u, 4u, 3u}) {
    eval.batch(i, x, y);
    for (int r = 0; r < B; ++r)
      for (int t = 0; t < T; ++t) {
        const auto k = static_cast<std::size_t>(r * T + t);
        EXPECT_EQ(x[k], static_cast<std::int32_t>(50000 + (i * B + r) * T + t));
        EXPECT_EQ(y[k], x[k] + 1);
      }
  }
  EvalLoader(data, B, T).batch(3, x2, y2);
  eval.batch(3, x, y);
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  EXPECT_THROW(eval.batch(5, x, y), Error);
  EXPECT_THROW(EvalLoader(data, 20, 5), ConfigError);
}

}  // namespace
}  // namespace desloc::data
