// The single-site trainer end to end on the Brown corpus: bit-exact resume, refusal of
// mismatched checkpoints, clear errors for missing data, and that training actually learns.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/data/shard.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/trainer.hpp"
#include "test_env.hpp"

using namespace desloc;
using desloc::test::fresh_dir;
using desloc::test::tiny_job_toml;

namespace {
train::JobConfig job(const std::filesystem::path& out, const std::string& extra_optim = "") {
  return train::parse_config(tiny_job_toml(out, DESLOC_TEST_BROWN, extra_optim),
                             (out / "job.toml").string());
}
int count_lines_with(const std::filesystem::path& file, const std::string& needle) {
  std::ifstream in(file);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}
}  // namespace

class Trainer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(test::have_prepared_corpus())
        << "the prepare_brown fixture did not produce " << DESLOC_TEST_BROWN;
  }
};

TEST_F(Trainer, ResumeIsBitExact) {
  for (const char* opt : {"", "name = \"adopt\"\nbeta2 = 0.999\nclip = \"coord\"\n"}) {
    SCOPED_TRACE(opt[0] ? "adopt + coord clip" : "adamw + norm clip");
    const auto straight_dir = fresh_dir("straight");
    const auto resumed_dir = fresh_dir("resumed");
    // The override keys are appended after the defaults in [optim]; TOML forbids duplicates,
    // so build the [optim] table from scratch for the ADOPT variant.
    auto make = [&](const std::filesystem::path& out) {
      std::string text = tiny_job_toml(out);
      if (opt[0]) {
        const auto at = text.find("[optim]\n");
        const auto end = text.find("[schedule]");
        text = text.substr(0, at) + "[optim]\n" + opt + "clip_value = 0.5\n" + text.substr(end);
      }
      return train::parse_config(text, (out / "job.toml").string());
    };
    const auto straight = train::run_training(make(straight_dir), {.progress = 0});
    EXPECT_EQ(straight.steps_done, 20);

    const auto first = train::run_training(make(resumed_dir), {.stop_after = 10, .progress = 0});
    EXPECT_EQ(first.steps_done, 10);
    const auto second = train::run_training(make(resumed_dir), {.resume = true, .progress = 0});
    EXPECT_EQ(second.start_step, 10);
    EXPECT_EQ(second.steps_done, 20);

    const auto a =
        train::load_checkpoint(train::checkpoint_path((straight_dir / "checkpoints").string(), 20));
    const auto b =
        train::load_checkpoint(train::checkpoint_path((resumed_dir / "checkpoints").string(), 20));
    test::expect_bitwise_equal(a, b);
    EXPECT_EQ(a.tokens_seen, b.tokens_seen);
    EXPECT_EQ(straight.last_train_loss, second.last_train_loss);
    // The resumed run's metrics describe one trajectory: 20 train records, no duplicates.
    EXPECT_EQ(count_lines_with(resumed_dir / "metrics.jsonl", "\"type\":\"train\""), 20);
  }
}

TEST_F(Trainer, ResumeRefusesAChangedConfigAndOverwritesNothing) {
  const auto dir = fresh_dir("hash");
  train::run_training(job(dir), {.stop_after = 5, .progress = 0});
  const std::string ckpt = train::checkpoint_path((dir / "checkpoints").string(), 5);
  const auto before = read_file(ckpt);
  const auto metrics_before = read_file((dir / "metrics.jsonl").string());
  auto changed = job(dir);
  changed.schedule.lr = 0.02f;
  try {
    train::run_training(changed, {.resume = true, .progress = 0});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("config hash"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(ckpt), std::string::npos) << e.message();
  }
  EXPECT_EQ(read_file(ckpt), before);
  EXPECT_EQ(read_file((dir / "metrics.jsonl").string()), metrics_before);
}

// Issue 18, item 2: a fresh start into an out_dir that holds another run's results refuses,
// naming the directory and what is in it, and writes nothing; --force overwrites.
TEST_F(Trainer, FreshStartOverAnotherRunRefusesUnlessForced) {
  const auto dir = fresh_dir("clobber");
  train::run_training(job(dir), {.stop_after = 5, .progress = 0});
  const std::string ckpt = train::checkpoint_path((dir / "checkpoints").string(), 5);
  const auto before = read_file(ckpt);
  const auto metrics_before = read_file((dir / "metrics.jsonl").string());
  auto other = job(dir);
  other.schedule.lr = 0.02f;  // even another config
  try {
    train::run_training(other, {.progress = 0});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    for (const std::string& part : {dir.string(), std::string("1 checkpoint"),
                                    std::string("--resume"), std::string("--force")})
      EXPECT_NE(e.message().find(part), std::string::npos) << part << " in " << e.message();
  }
  EXPECT_EQ(read_file(ckpt), before);
  EXPECT_EQ(read_file((dir / "metrics.jsonl").string()), metrics_before);
  const auto forced = train::run_training(other, {.progress = 0, .force = true});
  EXPECT_EQ(forced.steps_done, 20);
}

// Issue 18, item 3: one checkpoint scan with the same rules everywhere. A directory named like
// a checkpoint (std::bad_alloc before), a misnamed file and another rank's checkpoint copied in
// are each passed over, and the run resumes from the newest checkpoint that is really its own.
TEST_F(Trainer, ResumePassesOverDirectoriesMisnamedFilesAndOtherRanksCheckpoints) {
  const auto dir = fresh_dir("ckptedge");
  const auto ckdir = dir / "checkpoints";
  auto cfg = job(dir);
  cfg.train.checkpoint_every = 5;
  train::run_training(cfg, {.stop_after = 10, .progress = 0});
  std::filesystem::create_directories(ckdir / "step_00000150.ckpt");
  std::filesystem::copy_file(train::checkpoint_path(ckdir.string(), 10),
                             train::checkpoint_path(ckdir.string(), 15));
  auto foreign = train::load_checkpoint(train::checkpoint_path(ckdir.string(), 10));
  EXPECT_EQ(foreign.writer, "in-process");
  foreign.writer = "east/0";
  foreign.step = 12;
  train::save_checkpoint(train::checkpoint_path(ckdir.string(), 12), foreign);

  const auto scan = train::scan_checkpoints(ckdir.string(), "in-process");
  ASSERT_EQ(scan.valid.size(), 2u);
  EXPECT_EQ(scan.valid[0].step, 10);
  ASSERT_EQ(scan.rejected.size(), 3u);
  EXPECT_NE(scan.rejected[0].reason.find("is a directory, not a checkpoint file"),
            std::string::npos)
      << scan.rejected[0].reason;
  EXPECT_NE(scan.rejected[1].reason.find("holds step 10 but is named for step 15"),
            std::string::npos)
      << scan.rejected[1].reason;
  EXPECT_NE(scan.rejected[2].reason.find("written by east/0, not by in-process"), std::string::npos)
      << scan.rejected[2].reason;

  const auto resumed = train::run_training(cfg, {.resume = true, .progress = 0});
  EXPECT_EQ(resumed.start_step, 10);
  EXPECT_EQ(resumed.steps_done, 20);
}

// Issue 18, item 11 (the trainer's side): resuming a finished run runs nothing and says so.
TEST_F(Trainer, ResumingAFinishedRunIsNothingToDo) {
  const auto dir = fresh_dir("finished");
  train::run_training(job(dir), {.progress = 0});
  const auto again = train::run_training(job(dir), {.resume = true, .progress = 0});
  EXPECT_TRUE(again.already_finished);
  EXPECT_EQ(again.start_step, 20);
  EXPECT_EQ(again.steps_done, 20);
}

TEST_F(Trainer, ResumeWithoutCheckpointSaysSo) {
  const auto dir = fresh_dir("nockpt");
  try {
    train::run_training(job(dir), {.resume = true, .progress = 0});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find("no valid checkpoint"), std::string::npos) << e.message();
  }
}

TEST_F(Trainer, MissingDataDirectoryIsNamedAndNothingIsWritten) {
  const auto dir = fresh_dir("nodata");
  const auto out = dir / "out";
  auto cfg =
      train::parse_config(tiny_job_toml(out, (dir / "no_such_dataset").string()), "job.toml");
  try {
    train::run_training(cfg, {.progress = 0});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find("no_such_dataset"), std::string::npos) << e.message();
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(Trainer, CorruptShardIsRejectedWithItsPath) {
  const auto dir = fresh_dir("badshard");
  const auto data = dir / "data";
  std::filesystem::copy(DESLOC_TEST_BROWN, data, std::filesystem::copy_options::recursive);
  std::string victim;
  for (const auto& e : std::filesystem::directory_iterator(data))
    if (e.path().extension() == ".bin") victim = e.path().string();
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("XXXX", 4);
  }
  auto cfg = train::parse_config(tiny_job_toml(dir / "out", data.string()), "job.toml");
  try {
    train::run_training(cfg, {.progress = 0});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find(victim), std::string::npos) << e.message();
  }
}

// The Brown corpus's shards rewritten as nanoGPT's train.bin / val.bin and as llm.c's .bin
// files: training on them in place (data.format) reaches the same x, u, v and data position as
// training on desloc's shards, bit for bit.
TEST_F(Trainer, NanogptAndLlmcTokenFilesTrainAsDeslocShardsDo) {
  const auto dir = fresh_dir("formats");
  const data::DatasetInfo brown = data::load_dataset(DESLOC_TEST_BROWN);
  std::vector<std::vector<std::uint16_t>> train;
  for (const auto& p : brown.train_shards) train.push_back(data::read_shard(p).tokens);
  const std::vector<std::uint16_t> val = data::read_shard(brown.val_shard).tokens;
  auto write = [](const std::filesystem::path& p, const std::vector<std::int32_t>& header,
                  const std::vector<std::uint16_t>& tokens) {
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()),
              static_cast<std::streamsize>(header.size() * 4));
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * 2));
  };
  auto llmc_header = [](std::size_t n) {
    std::vector<std::int32_t> h(256, 0);
    h[0] = 20240520;
    h[1] = 1;
    h[2] = static_cast<std::int32_t>(n);
    return h;
  };
  std::filesystem::create_directories(dir / "nanogpt");
  std::filesystem::create_directories(dir / "llmc");
  std::vector<std::uint16_t> all;
  for (std::size_t i = 0; i < train.size(); ++i) {
    all.insert(all.end(), train[i].begin(), train[i].end());
    write(dir / "llmc" / fmt::format("brown_train_{:06}.bin", i + 1), llmc_header(train[i].size()),
          train[i]);
  }
  write(dir / "nanogpt" / "train.bin", {}, all);
  write(dir / "nanogpt" / "val.bin", {}, val);
  write(dir / "llmc" / "brown_val_000000.bin", llmc_header(val.size()), val);

  const auto shards_out = dir / "shards";
  const auto reference = train::run_training(job(shards_out), {.progress = 0});
  const auto ref =
      train::load_checkpoint(train::checkpoint_path((shards_out / "checkpoints").string(), 20));
  for (const char* format : {"nanogpt", "llmc"}) {
    SCOPED_TRACE(format);
    const auto out = dir / (std::string("out_") + format);
    std::string text = tiny_job_toml(out, (dir / format).string());
    text.replace(text.find("[data]\n"), 7, fmt::format("[data]\nformat = \"{}\"\n", format));
    const auto r = train::run_training(train::parse_config(text, "job.toml"), {.progress = 0});
    EXPECT_EQ(r.last_val_loss, reference.last_val_loss);
    test::expect_bitwise_equal(
        ref, train::load_checkpoint(train::checkpoint_path((out / "checkpoints").string(), 20)));
  }
}

TEST_F(Trainer, LossFallsAndMetricsAreComplete) {
  const auto dir = fresh_dir("learn");
  auto cfg = job(dir);
  cfg.train.steps = 60;
  cfg.train.eval_every = 30;
  const auto r = train::run_training(cfg, {.progress = 0});
  // ln(256) = 5.545 at initialisation; 60 steps must get well below the unigram entropy
  // is too much to ask of 60 tiny steps, but far below uniform is not.
  EXPECT_LT(r.last_train_loss, 4.0f);
  EXPECT_TRUE(std::isfinite(r.last_val_loss));
  EXPECT_LT(r.last_val_loss, 4.0f);
  EXPECT_GT(r.unigram_entropy_nats, 2.5);
  EXPECT_EQ(count_lines_with(dir / "metrics.jsonl", "\"type\":\"train\""), 60);
  EXPECT_EQ(count_lines_with(dir / "metrics.jsonl", "\"type\":\"eval\""), 2);
  EXPECT_EQ(count_lines_with(dir / "metrics.jsonl", "\"bytes_sent\":0"), 60);
}
