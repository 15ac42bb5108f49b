// Checkpoint files: round trip, and rejection of every kind of damage.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <functional>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/train/checkpoint.hpp"

using namespace desloc;
namespace fs = std::filesystem;

namespace {
class CheckpointFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("desloc_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  train::Checkpoint sample() const {
    train::Checkpoint ck;
    ck.config_hash = 0xfeedbeefcafef00dull;
    ck.step = 42;
    ck.tokens_seen = 123456;
    for (int w = 0; w < 3; ++w) {
      train::WorkerState s;
      s.optim_t = 41 + w;
      s.loader = {3, 17u + std::uint64_t(w)};
      for (int i = 0; i < 1000; ++i) {
        s.params.push_back(float(i) * 0.5f + float(w));
        s.u.push_back(-float(i));
        s.v.push_back(float(i * i));
      }
      ck.workers.push_back(std::move(s));
    }
    ck.outer_ref = {1.0f, 2.0f};
    ck.outer_momentum = {-1.0f, 0.5f};
    return ck;
  }
  std::string path(const char* name) const { return (dir_ / name).string(); }
  std::string expect_data_error(const std::string& p) {
    try {
      train::load_checkpoint(p);
    } catch (const DataError& e) {
      EXPECT_NE(e.message().find(p), std::string::npos) << e.message();
      return e.message();
    }
    ADD_FAILURE() << "no DataError for " << p;
    return "";
  }
  void mutate(const std::string& p, const std::function<void(std::vector<std::uint8_t>&)>& f) {
    auto bytes = read_file(p);
    f(bytes);
    std::ofstream(p, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  fs::path dir_;
};
}  // namespace

TEST_F(CheckpointFile, RoundTripIsExact) {
  const auto ck = sample();
  train::save_checkpoint(path("a.ckpt"), ck);
  const auto back = train::load_checkpoint(path("a.ckpt"));
  EXPECT_EQ(back.config_hash, ck.config_hash);
  EXPECT_EQ(back.step, 42);
  EXPECT_EQ(back.tokens_seen, 123456u);
  ASSERT_EQ(back.workers.size(), 3u);
  for (std::size_t w = 0; w < 3; ++w) {
    EXPECT_EQ(back.workers[w].optim_t, 41 + std::int64_t(w));
    EXPECT_EQ(back.workers[w].loader.epoch, 3u);
    EXPECT_EQ(back.workers[w].loader.cursor, 17u + w);
    EXPECT_EQ(back.workers[w].params, ck.workers[w].params);
    EXPECT_EQ(back.workers[w].u, ck.workers[w].u);
    EXPECT_EQ(back.workers[w].v, ck.workers[w].v);
  }
  EXPECT_EQ(back.outer_ref, ck.outer_ref);
  EXPECT_EQ(back.outer_momentum, ck.outer_momentum);
  // No temporary files are left behind.
  int files = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1);
}

TEST_F(CheckpointFile, MissingFile) { expect_data_error(path("none.ckpt")); }

TEST_F(CheckpointFile, WrongMagic) {
  train::save_checkpoint(path("a.ckpt"), sample());
  mutate(path("a.ckpt"), [](auto& b) { b[0] = 'X'; });
  EXPECT_NE(expect_data_error(path("a.ckpt")).find("magic"), std::string::npos);
}

TEST_F(CheckpointFile, WrongVersion) {
  train::save_checkpoint(path("a.ckpt"), sample());
  mutate(path("a.ckpt"), [](auto& b) { b[8] = 9; });  // version field
  EXPECT_NE(expect_data_error(path("a.ckpt")).find("version 9"), std::string::npos);
}

TEST_F(CheckpointFile, Truncated) {
  train::save_checkpoint(path("a.ckpt"), sample());
  mutate(path("a.ckpt"), [](auto& b) { b.resize(b.size() - 100); });
  EXPECT_NE(expect_data_error(path("a.ckpt")).find("truncated"), std::string::npos);
  mutate(path("a.ckpt"), [](auto& b) { b.resize(10); });
  EXPECT_NE(expect_data_error(path("a.ckpt")).find("truncated"), std::string::npos);
}

TEST_F(CheckpointFile, TrailingBytes) {
  train::save_checkpoint(path("a.ckpt"), sample());
  mutate(path("a.ckpt"), [](auto& b) { b.push_back(0); });
  EXPECT_NE(expect_data_error(path("a.ckpt")).find("oversized"), std::string::npos);
}

TEST_F(CheckpointFile, FlippedBitFailsCrc) {
  train::save_checkpoint(path("a.ckpt"), sample());
  mutate(path("a.ckpt"), [](auto& b) { b[b.size() / 2] ^= 0x10; });
  EXPECT_NE(expect_data_error(path("a.ckpt")).find("CRC"), std::string::npos);
}

TEST_F(CheckpointFile, LatestSkipsCorruptAndPartialFiles) {
  auto ck = sample();
  for (std::int64_t s : {10, 20, 30}) {
    ck.step = s;
    train::save_checkpoint(train::checkpoint_path(dir_.string(), s), ck);
  }
  mutate(train::checkpoint_path(dir_.string(), 30), [](auto& b) { b.resize(b.size() / 2); });
  const auto found = train::find_latest_checkpoint(dir_.string());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 20);
  EXPECT_EQ(found->path, train::checkpoint_path(dir_.string(), 20));
  EXPECT_FALSE(train::find_latest_checkpoint((dir_ / "nothing").string()).has_value());
}
