// Using a trained model from the CLI: `desloc sample` and `desloc export` on real checkpoints,
// and every kind of bad input they must refuse with a message that names it.
#include <gtest/gtest.h>

#include "desloc/core/file_io.hpp"
#include "desloc/train/checkpoint.hpp"
#include "test_env.hpp"

using namespace desloc::test;

namespace {
std::string cli() { return std::string("'") + DESLOC_CLI + "'"; }

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A tiny job trained for 20 steps; returns its checkpoint.
fs::path trained_checkpoint(const fs::path& dir, const std::string& data = DESLOC_TEST_BROWN,
                            int vocab = 256, int seed = 3) {
  fs::create_directories(dir);
  std::string toml = tiny_job_toml(dir / "out", data);
  toml.replace(toml.find("vocab = 256"), 11, "vocab = " + std::to_string(vocab));
  toml.replace(toml.find("seed = 3"), 8, "seed = " + std::to_string(seed));
  const auto cfg = write_text(dir / "job.toml", toml);
  const auto r = run_command(cli() + " train --no-progress -c '" + cfg.string() + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir / "out" / "checkpoints" / "step_00000020.ckpt";
}

std::string stdout_of(const std::string& cmd) { return run_command(cmd + " -q").output; }

TEST(ModelUse, SampleStreamsTheSameTextForASeed) {
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("use_sample");
  const auto ckpt = trained_checkpoint(dir);
  const std::string base =
      cli() + " sample --checkpoint '" + ckpt.string() + "' --prompt 'The jury' --tokens 20";
  const std::string a = stdout_of(base + " --seed 7");
  EXPECT_TRUE(a.starts_with("The jury")) << a;
  EXPECT_EQ(a.size(), std::string("The jury").size() + 20 + 1) << "20 byte tokens and a newline";
  EXPECT_EQ(stdout_of(base + " --seed 7"), a);
  EXPECT_EQ(stdout_of(base + " --seed 7 --no-cache"), a);
  EXPECT_NE(stdout_of(base + " --seed 8"), a);
  const auto summary = run_command(base + " --seed 7");
  EXPECT_TRUE(contains(summary.output, "tokens/s, KV cache")) << summary.output;
}

TEST(ModelUse, BadInputIsRefusedByName) {
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("use_bad");
  const auto ckpt = trained_checkpoint(dir);
  const std::string sample = cli() + " sample --checkpoint '" + ckpt.string() + "' ";
  auto refused = [](const CommandResult& r, const std::string& what) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, what)) << "wanted '" << what << "' in\n" << r.output;
  };
  refused(run_command(sample + "--prompt a --temperature 0"), "--temperature");
  refused(run_command(sample + "--prompt a --temperature -1"), "--temperature");
  refused(run_command(sample + "--prompt a --top-k 0"), "--top-k");
  refused(run_command(sample + "--prompt ''"), "empty");
  const auto too_long = run_command(sample + "--prompt '" + std::string(33, 'x') + "'");
  refused(too_long, "the model's context is 32");
  // Refused before anything is printed: not the prompt, then an error.
  EXPECT_FALSE(contains(too_long.output, std::string(33, 'x') + "\n")) << too_long.output;
  const auto seed = run_command(sample + "--prompt a --seed -1");
  refused(seed, "--seed: must be a whole number, at least 0 (a random seed), got -1");
  EXPECT_FALSE(seed.output.starts_with("a")) << seed.output;
  refused(run_command(sample + "--prompt a --site 1"), "--site 1");

  // A corrupt and a truncated checkpoint, for both commands, named with the reason.
  auto bytes = desloc::read_file(ckpt.string());
  bytes[bytes.size() / 2] ^= 0x40;
  desloc::write_file_atomic((dir / "corrupt.ckpt").string(), bytes);
  bytes[bytes.size() / 2] ^= 0x40;
  bytes.resize(bytes.size() - 100);
  desloc::write_file_atomic((dir / "short.ckpt").string(), bytes);
  for (const char* cmd : {" sample --prompt a", " export --out x"}) {
    const auto c =
        run_command(cli() + cmd + " --checkpoint '" + (dir / "corrupt.ckpt").string() + "'");
    refused(c, "corrupt.ckpt");
    refused(c, "CRC32C");
    const auto t =
        run_command(cli() + cmd + " --checkpoint '" + (dir / "short.ckpt").string() + "'");
    refused(t, "short.ckpt");
    refused(t, "truncated");
  }
  EXPECT_FALSE(fs::exists("x")) << "a failed export left its directory";

  // Checkpoints of two different jobs are not the sites of one job.
  const auto other = trained_checkpoint(dir / "b", DESLOC_TEST_BROWN, 256, 4);
  refused(run_command(cli() + " export --out y --checkpoint '" + ckpt.string() +
                      "' --checkpoint '" + other.string() + "'"),
          "are not the sites of one job");
  // Two sites' files of one job (here: the same run twice) export their mean.
  const auto two =
      run_command(cli() + " export --out '" + (dir / "two").string() + "' --checkpoint '" +
                  ckpt.string() + "' --checkpoint '" + ckpt.string() + "'");
  EXPECT_EQ(two.exit_code, 0) << two.output;
  EXPECT_TRUE(contains(two.output, "the mean of 2 sites")) << two.output;

  // An existing output directory is refused and left alone; --force replaces it whole.
  fs::create_directories(dir / "exported");
  write_text(dir / "exported" / "keep.txt", "mine");
  const std::string exp = cli() + " export --checkpoint '" + ckpt.string() + "' --out '" +
                          (dir / "exported").string() + "'";
  refused(run_command(exp), "--force");
  EXPECT_TRUE(fs::exists(dir / "exported" / "keep.txt"));
  const auto forced = run_command(exp + " --force");
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_TRUE(fs::exists(dir / "exported" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "exported" / "keep.txt"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_FALSE(contains(e.path().filename().string(), ".partial-")) << e.path();
}

TEST(ModelUse, ARunDirectoryMeansItsNewestStepThatEverySiteHolds) {
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("use_rundir");
  const auto ckpt = trained_checkpoint(dir);
  // An in-process run directory: its own checkpoints.
  auto r = run_command(cli() + " sample -q --tokens 3 --prompt a --checkpoint '" +
                       (dir / "out").string() + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A networked run's layout: the leader's site at the top, the other sites' rank 0 (and
  // further ranks, which hold the same x) under ranks/. east-0 lacks step 20, so step 10 is
  // the newest that every site holds.
  const fs::path run = dir / "net";
  for (const char* sub : {"checkpoints", "ranks/east-0/checkpoints", "ranks/east-1/checkpoints",
                          "ranks/west-1/checkpoints"})
    fs::create_directories(run / sub);
  for (const char* sub : {"checkpoints", "ranks/east-1/checkpoints", "ranks/west-1/checkpoints"})
    fs::copy_file(ckpt, run / sub / "step_00000020.ckpt");
  // Step 10: the same state saved under another step.
  {
    auto ck = desloc::train::load_checkpoint(ckpt.string());
    ck.step = 10;
    for (const char* sub : {"checkpoints", "ranks/east-0/checkpoints"})
      desloc::train::save_checkpoint((run / sub / "step_00000010.ckpt").string(), ck);
  }
  const fs::path out = dir / "exported";
  r = run_command(cli() + " export --checkpoint '" + run.string() + "' --out '" + out.string() +
                  "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "exported step 10 (the mean of 2 sites)")) << r.output;
  const std::string record = read_text(out / "desloc_export.json");
  EXPECT_TRUE(contains(record, "ranks/east-0/checkpoints/step_00000010.ckpt")) << record;
  // A run whose sites share no step is refused, naming it.
  fs::remove(run / "ranks/east-0/checkpoints/step_00000010.ckpt");
  r = run_command(cli() + " export --checkpoint '" + run.string() + "' --out '" +
                  (dir / "none").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "no checkpoint step that every site of the run has")) << r.output;
}

TEST(ModelUse, ACheckpointIsNeverPairedWithAnotherVocabulary) {
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("use_vocab");
  // A SentencePiece dataset from the first 400 kB of the prepared Brown text.
  std::string text;
  for (const auto& entry : fs::directory_iterator(DESLOC_TEST_BROWN))
    if (entry.path().filename() == "train_000.bin") {
      const auto b = desloc::read_file(entry.path().string());
      text.assign(b.begin() + 32, b.begin() + 32 + 2 * 200000);  // tokens are u16 bytes
    }
  std::string ascii;
  for (std::size_t i = 0; i < text.size(); i += 2) ascii += text[i];
  write_text(dir / "corpus.txt", ascii);
  // Two vocabularies of the same size: BPE and unigram.
  for (const char* type : {"bpe", "unigram"}) {
    const auto p = run_command(cli() + " prepare --source '" + (dir / "corpus.txt").string() +
                               "' --out '" + (dir / type).string() +
                               "' --tokenizer sentencepiece --vocab 400 --sp-model " + type);
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const auto ckpt = trained_checkpoint(dir / "run", (dir / "bpe").string(), 400);
  const std::string sample =
      cli() + " sample --checkpoint '" + ckpt.string() + "' --prompt 'The jury' --tokens 5";
  EXPECT_EQ(run_command(sample).exit_code, 0);

  // The model file moved: named, with the way out; --tokenizer finds it.
  fs::rename(dir / "bpe" / "tokenizer.model", dir / "moved.model");
  auto r = run_command(sample);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, (dir / "bpe" / "tokenizer.model").string())) << r.output;
  EXPECT_TRUE(contains(r.output, "--tokenizer")) << r.output;
  r = run_command(sample + " --tokenizer '" + (dir / "moved.model").string() + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // Another vocabulary under that name: refused, for sample and for export.
  fs::copy_file(dir / "unigram" / "tokenizer.model", dir / "bpe" / "tokenizer.model");
  r = run_command(sample);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "another vocabulary")) << r.output;
  r = run_command(cli() + " export --checkpoint '" + ckpt.string() + "' --out '" +
                  (dir / "e").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "another vocabulary")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "e"));

  // Resuming the run with the other vocabulary's data is refused by the config hash.
  fs::copy_file(dir / "moved.model", dir / "bpe" / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  std::string toml = read_text(dir / "run" / "job.toml");
  toml.replace(toml.find((dir / "bpe").string()), (dir / "bpe").string().size(),
               (dir / "unigram").string());
  toml.replace(toml.find("steps = 20"), 10, "steps = 30");
  write_text(dir / "run" / "other.toml", toml);
  r = run_command(cli() + " train --no-progress --resume -c '" +
                  (dir / "run" / "other.toml").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "config hash")) << r.output;
}

}  // namespace
