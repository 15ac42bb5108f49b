// Checkpoint files: round trip, and rejection of every kind of damage.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/train/checkpoint.hpp"

using namespace desloc;
namespace fs = std::filesystem;

namespace {
// The file's parts, in bytes: the header (magic, version, reserved, payload length, CRC), and
// at the payload's end version 6's period switches (a count and 32 entries of four int64s),
// version 5's model description and version 3's writer name.
constexpr std::size_t kHeader = 28, kRunId = 8, kSwitches = 8 + 32 * 4 * 8, kModel = 556,
                      kWriter = 64;

// After an edit of the payload: its length and CRC32C in the header again, so that only the
// edit is left for a reader to object to.
void reseal(std::vector<std::uint8_t>& b) {
  const std::uint64_t payload = b.size() - kHeader;
  std::memcpy(b.data() + 16, &payload, 8);
  const std::uint32_t crc = crc32c(std::span<const std::uint8_t>(b.data() + kHeader, payload));
  std::memcpy(b.data() + 24, &crc, 4);
}

// A file of an older `version`: the `bytes` bytes that end `tail` bytes before the end (what
// that version did not have) removed.
void downgrade(std::vector<std::uint8_t>& b, std::uint8_t version, std::size_t tail,
               std::size_t bytes) {
  b.erase(b.end() - static_cast<std::ptrdiff_t>(tail + bytes),
          b.end() - static_cast<std::ptrdiff_t>(tail));
  b[8] = version;
  reseal(b);
}

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
      train::SiteState s;
      s.optim_t = 41 + w;
      s.loader = {3, 17u + std::uint64_t(w)};
      for (int i = 0; i < 1000; ++i) {
        s.params.push_back(float(i) * 0.5f + float(w));
        s.u.push_back(-float(i));
        s.v.push_back(float(i * i));
      }
      ck.sites.push_back(std::move(s));
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
  ASSERT_EQ(back.sites.size(), 3u);
  for (std::size_t w = 0; w < 3; ++w) {
    EXPECT_EQ(back.sites[w].optim_t, 41 + std::int64_t(w));
    EXPECT_EQ(back.sites[w].loader.epoch, 3u);
    EXPECT_EQ(back.sites[w].loader.cursor, 17u + w);
    EXPECT_EQ(back.sites[w].params, ck.sites[w].params);
    EXPECT_EQ(back.sites[w].u, ck.sites[w].u);
    EXPECT_EQ(back.sites[w].v, ck.sites[w].v);
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

// Damage of every kind: validate_checkpoint (streaming, no load) rejects it with exactly the
// message load_checkpoint gives. The payload spans several 1 MiB blocks, so the flipped bit
// near the end lies in a later block than the first.
TEST_F(CheckpointFile, ValidateAgreesWithLoadOnEveryDamage) {
  auto ck = sample();
  ck.sites[0].params.assign(200'000, 0.25f);  // 2.4 MB per worker
  ck.sites[0].u.assign(200'000, 0.5f);
  ck.sites[0].v.assign(200'000, 0.75f);
  for (std::size_t w = 1; w < ck.sites.size(); ++w) ck.sites[w] = ck.sites[0];
  const std::string p = path("big.ckpt");
  train::save_checkpoint(p, ck);
  const auto info = train::validate_checkpoint(p);
  EXPECT_EQ(info.step, 42);
  EXPECT_EQ(info.config_hash, ck.config_hash);
  EXPECT_EQ(info.file_bytes, fs::file_size(p));
  EXPECT_EQ(info.path, p);
  const std::vector<std::uint8_t> good = read_file(p);
  const std::vector<std::pair<const char*, std::function<void(std::vector<std::uint8_t>&)>>>
      damages = {
          {"magic", [](auto& b) { b[0] = 'X'; }},
          {"version", [](auto& b) { b[8] = 9; }},
          {"truncated", [](auto& b) { b.resize(b.size() - 100); }},
          {"truncated", [](auto& b) { b.resize(10); }},
          {"truncated", [](auto& b) { b.clear(); }},
          {"oversized", [](auto& b) { b.push_back(0); }},
          {"CRC", [](auto& b) { b[b.size() - 5] ^= 0x10; }},
          {"CRC", [](auto& b) { b[40] ^= 0x01; }},
      };
  for (const auto& [expect, damage] : damages) {
    mutate(p, [&](auto& b) {
      b = good;
      damage(b);
    });
    std::string from_load, from_validate;
    try {
      train::load_checkpoint(p);
    } catch (const DataError& e) {
      from_load = e.message();
    }
    try {
      train::validate_checkpoint(p);
    } catch (const DataError& e) {
      from_validate = e.message();
    }
    EXPECT_NE(from_load.find(expect), std::string::npos) << from_load;
    EXPECT_EQ(from_validate, from_load) << expect;
  }
  EXPECT_THROW(train::validate_checkpoint(path("none.ckpt")), DataError);
}

// A CRC-valid file whose layout is inconsistent (the header and CRC rewritten around a bad
// site count) is rejected by both readers alike.
TEST_F(CheckpointFile, ValidateRejectsInconsistentLayout) {
  train::save_checkpoint(path("a.ckpt"), sample());
  mutate(path("a.ckpt"), [](auto& b) {
    b[kHeader + 32] = 200;  // the site count: 200 sites cannot fit
    reseal(b);
  });
  std::string from_load;
  try {
    train::load_checkpoint(path("a.ckpt"));
  } catch (const DataError& e) {
    from_load = e.message();
  }
  EXPECT_NE(from_load.find("inconsistent"), std::string::npos) << from_load;
  try {
    train::validate_checkpoint(path("a.ckpt"));
    ADD_FAILURE() << "validate_checkpoint accepted an inconsistent layout";
  } catch (const DataError& e) {
    EXPECT_EQ(e.message(), from_load);
  }
}

TEST_F(CheckpointFile, ScanSkipsCorruptPartialAndMisnamedFilesNamingEach) {
  auto ck = sample();
  const std::string dir = dir_.string();
  for (std::int64_t s : {10, 20, 30, 40}) {
    ck.step = s;
    train::save_checkpoint(train::checkpoint_path(dir, s), ck);
  }
  mutate(train::checkpoint_path(dir, 40), [](auto& b) { b[b.size() / 2] ^= 0x10; });
  mutate(train::checkpoint_path(dir, 30), [](auto& b) { b.resize(b.size() / 2); });
  fs::copy_file(train::checkpoint_path(dir, 10), train::checkpoint_path(dir, 15));
  std::ofstream(dir_ / "step_00000050.ckpt.tmp.123") << "interrupted write";  // ignored
  std::ofstream(dir_ / "notes.txt") << "user file";                           // ignored

  ::testing::internal::CaptureStderr();
  const train::CheckpointScan scan = train::scan_checkpoints(dir);
  const std::string log = ::testing::internal::GetCapturedStderr();

  ASSERT_EQ(scan.valid.size(), 2u);
  EXPECT_EQ(scan.valid[0].step, 20);
  EXPECT_EQ(scan.valid[0].path, train::checkpoint_path(dir, 20));
  EXPECT_EQ(scan.valid[1].step, 10);
  EXPECT_EQ(scan.valid[0].config_hash, ck.config_hash);
  ASSERT_EQ(scan.rejected.size(), 3u);
  const std::pair<std::int64_t, const char*> expect[] = {
      {40, "CRC32C mismatch"}, {30, "truncated"}, {15, "holds step 10 but is named for step 15"}};
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& r = scan.rejected[i];
    EXPECT_EQ(r.step, expect[i].first);
    EXPECT_EQ(r.path, train::checkpoint_path(dir, expect[i].first));
    EXPECT_NE(r.reason.find(expect[i].second), std::string::npos) << r.reason;
    EXPECT_NE(r.reason.find(r.path), std::string::npos) << r.reason;
    // The warning names the file and the reason.
    EXPECT_NE(log.find("skipping checkpoint " + r.path + ": " + r.reason), std::string::npos)
        << log;
  }
  const auto listed = train::list_valid_checkpoints(dir);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].step, 20);
  EXPECT_EQ(listed[1].step, 10);
  EXPECT_TRUE(train::list_valid_checkpoints((dir_ / "nothing").string()).empty());
  // find_latest_checkpoint keeps its behaviour: the newest file that loads.
  const auto latest = train::find_latest_checkpoint(dir);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->checkpoint.step, 20);
}

// Version 4 keeps the compressed states' references and each worker's error feedback; a
// version 3 file (written before codecs existed) still loads, with none.
TEST_F(CheckpointFile, CompressedStatesRoundTripAndVersion3FilesStillLoad) {
  auto ck = sample();
  ck.codec_ref[1].assign(1000, 0.25f);  // u compressed, with feedback
  ck.codec_ref[2].assign(1000, 2.0f);   // v compressed, without
  for (std::size_t w = 0; w < ck.sites.size(); ++w)
    ck.sites[w].codec_feedback[1].assign(1000, -0.5f * float(w + 1));
  train::save_checkpoint(path("v4.ckpt"), ck);
  const auto back = train::load_checkpoint(path("v4.ckpt"));
  EXPECT_EQ(back.codec_ref, ck.codec_ref);
  for (std::size_t w = 0; w < ck.sites.size(); ++w)
    EXPECT_EQ(back.sites[w].codec_feedback, ck.sites[w].codec_feedback);
  EXPECT_EQ(train::validate_checkpoint(path("v4.ckpt")).step, 42);

  // A feedback without its reference is refused at write time.
  auto bad = ck;
  bad.sites[0].codec_feedback[0].assign(1000, 1.0f);
  EXPECT_THROW(train::save_checkpoint(path("bad.ckpt"), bad), Error);

  // Version 3: the same payload without the six codec sizes (all zero without codecs).
  train::save_checkpoint(path("v3.ckpt"), sample());
  mutate(path("v3.ckpt"), [](auto& b) {
    constexpr std::size_t kCodecHead = 48;
    downgrade(b, 3, kWriter, kModel + kSwitches + kRunId + kCodecHead);
  });
  const auto old = train::load_checkpoint(path("v3.ckpt"));
  EXPECT_EQ(old.sites[2].params, sample().sites[2].params);
  EXPECT_EQ(old.outer_momentum, sample().outer_momentum);
  EXPECT_TRUE(old.codec_ref[0].empty() && old.sites[0].codec_feedback[1].empty());
  EXPECT_EQ(train::validate_checkpoint(path("v3.ckpt")).step, 42);

  // A CRC-valid version 4 file whose codec sizes do not fit: both readers refuse it alike.
  mutate(path("v4.ckpt"), [](auto& b) {
    // The sizes sit before the codec data (1000 + 1000 + 3 x 1000 floats), the period
    // switches, the model description and the writer.
    const std::size_t sizes_at = b.size() - kWriter - kModel - kSwitches - kRunId - 5000 * 4 - 48;
    const std::uint64_t wrong = 999;
    std::memcpy(b.data() + sizes_at, &wrong, 8);  // ref_n of x
    reseal(b);
  });
  const std::string from_load = expect_data_error(path("v4.ckpt"));
  EXPECT_NE(from_load.find("inconsistent"), std::string::npos) << from_load;
  try {
    train::validate_checkpoint(path("v4.ckpt"));
    ADD_FAILURE() << "validate_checkpoint accepted inconsistent codec sizes";
  } catch (const DataError& e) {
    EXPECT_EQ(e.message(), from_load);
  }
}

TEST_F(CheckpointFile, TheModelDescriptionRoundTripsAndVersion4FilesHaveNone) {
  auto ck = sample();
  ck.model = train::CheckpointModel{
      {300, 64, 2, 2, 32}, "sentencepiece", 0x1234abcdull, "/data/sp/tokenizer.model"};
  train::save_checkpoint(path("v5.ckpt"), ck);
  for (const auto& m : {train::load_checkpoint(path("v5.ckpt")).model,
                        train::validate_checkpoint(path("v5.ckpt")).model}) {
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->model.vocab, 300);
    EXPECT_EQ(m->model.context, 64);
    EXPECT_EQ(m->model.layers, 2);
    EXPECT_EQ(m->model.heads, 2);
    EXPECT_EQ(m->model.d_model, 32);
    EXPECT_EQ(m->tokenizer, "sentencepiece");
    EXPECT_EQ(m->tokenizer_hash, 0x1234abcdull);
    EXPECT_EQ(m->tokenizer_file, "/data/sp/tokenizer.model");
  }
  // A path too long for its field is not kept (the reader is told where the file is).
  ck.model->tokenizer_file = "/" + std::string(600, 'd') + "/tokenizer.model";
  train::save_checkpoint(path("long.ckpt"), ck);
  EXPECT_EQ(train::load_checkpoint(path("long.ckpt")).model->tokenizer_file, "");

  // Without a description (and in a version 4 file, which has no field for it): nullopt.
  train::save_checkpoint(path("none.ckpt"), sample());
  EXPECT_FALSE(train::load_checkpoint(path("none.ckpt")).model.has_value());
  mutate(path("none.ckpt"), [](auto& b) { downgrade(b, 4, kWriter, kModel + kSwitches + kRunId); });
  const auto v4 = train::load_checkpoint(path("none.ckpt"));
  EXPECT_FALSE(v4.model.has_value());
  EXPECT_EQ(v4.sites[1].params, sample().sites[1].params);
  EXPECT_EQ(v4.writer, sample().writer);
  EXPECT_EQ(train::validate_checkpoint(path("none.ckpt")).step, 42);

  // An impossible model (heads that do not divide d_model) is refused, naming the file.
  ck.model->model.heads = 3;
  train::save_checkpoint(path("bad.ckpt"), ck);
  const std::string msg = expect_data_error(path("bad.ckpt"));
  EXPECT_NE(msg.find("bad.ckpt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("impossible model"), std::string::npos) << msg;
}

TEST_F(CheckpointFile, TheRunIdRoundTripsAndVersion6FilesHaveNone) {
  auto ck = sample();
  ck.run_id = 0x0123456789abcdefull;
  train::save_checkpoint(path("v7.ckpt"), ck);
  EXPECT_EQ(train::load_checkpoint(path("v7.ckpt")).run_id, ck.run_id);
  EXPECT_EQ(train::validate_checkpoint(path("v7.ckpt")).run_id, ck.run_id);
  // Version 6: the same file without the run id; read back as 0, "unknown".
  mutate(path("v7.ckpt"), [](auto& b) { downgrade(b, 6, kWriter + kModel + kSwitches, kRunId); });
  const auto v6 = train::load_checkpoint(path("v7.ckpt"));
  EXPECT_EQ(v6.run_id, 0u);
  EXPECT_EQ(v6.sites[1].params, sample().sites[1].params);
  EXPECT_EQ(train::validate_checkpoint(path("v7.ckpt")).run_id, 0u);
}

TEST_F(CheckpointFile, AScanWithTheJobsConfigHashRejectsAnotherConfigsFileAsForeign) {
  auto ck = sample();
  train::save_checkpoint(path("step_00000042.ckpt"), ck);
  ck.step = 43;
  ck.config_hash = 0x1111;
  train::save_checkpoint(path("step_00000043.ckpt"), ck);
  const auto scan = train::scan_checkpoints(dir_.string(), "", 0xfeedbeefcafef00dull);
  ASSERT_EQ(scan.valid.size(), 1u);
  EXPECT_EQ(scan.valid[0].step, 42);
  ASSERT_EQ(scan.rejected.size(), 1u);
  EXPECT_TRUE(scan.rejected[0].foreign);
  EXPECT_NE(scan.rejected[0].reason.find("belongs to another config"), std::string::npos)
      << scan.rejected[0].reason;
  // Without a hash to compare, both are this job's.
  EXPECT_EQ(train::scan_checkpoints(dir_.string()).valid.size(), 2u);
}

TEST_F(CheckpointFile, PeriodSwitchesRoundTripAndVersion5FilesHaveNone) {
  auto ck = sample();
  ck.switches = {{96, 64, 192, 384}, {160, 8, 0, 0}};
  train::save_checkpoint(path("v6.ckpt"), ck);
  EXPECT_EQ(train::load_checkpoint(path("v6.ckpt")).switches, ck.switches);
  EXPECT_EQ(train::validate_checkpoint(path("v6.ckpt")).step, 42);
  ck.switches.assign(33, {1, 1, 0, 0});
  EXPECT_THROW(train::save_checkpoint(path("many.ckpt"), ck), Error);

  // Version 5: the same file without the switch block.
  ck.switches = {{96, 64, 192, 384}};
  train::save_checkpoint(path("v5.ckpt"), ck);
  mutate(path("v5.ckpt"), [](auto& b) { downgrade(b, 5, kWriter + kModel, kSwitches + kRunId); });
  const auto v5 = train::load_checkpoint(path("v5.ckpt"));
  EXPECT_TRUE(v5.switches.empty());
  EXPECT_EQ(v5.sites[2].params, sample().sites[2].params);
  EXPECT_EQ(train::validate_checkpoint(path("v5.ckpt")).step, 42);

  // A CRC-valid file whose switches go backwards: both readers refuse it.
  ck.switches = {{96, 64, 0, 0}, {50, 8, 0, 0}};
  train::save_checkpoint(path("back.ckpt"), ck);
  const std::string msg = expect_data_error(path("back.ckpt"));
  EXPECT_NE(msg.find("impossible period switch 2"), std::string::npos) << msg;
  EXPECT_THROW(train::validate_checkpoint(path("back.ckpt")), DataError);
}
