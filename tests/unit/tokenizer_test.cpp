// Tests of the SentencePiece tokenizer: lossless round trips, the bytes each token stands for
// (bits per byte), preparation with it, and a dataset whose model file is missing or changed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/data/shard.hpp"
#include "desloc/data/tokenizer.hpp"
#include "temp_dir_test.hpp"

namespace desloc::data {
namespace {
namespace fs = std::filesystem;

// English-like text with enough distinct words for a few hundred merges, tabs, runs of spaces,
// non-ASCII letters and lines of every length.
std::string corpus(int lines) {
  const char* words[] = {
      "the",       "jury",      "said",    "that",  "county", "election", "produced",      "no",
      "evidence",  "irregular", "took",    "place", "grand",  "Friday",   "investigation", "of",
      "Atlanta's", "recent",    "primary", "naïve", "café",   "Größe",    "über",          "x=1;"};
  std::string text;
  unsigned state = 12345;
  for (int i = 0; i < lines; ++i) {
    const int n = 3 + static_cast<int>(i % 17);
    for (int w = 0; w < n; ++w) {
      state = state * 1103515245u + 12345u;
      text += words[(state >> 16) % (sizeof(words) / sizeof(words[0]))];
      text += (state >> 8) % 23 == 0 ? "  " : (state >> 8) % 29 == 0 ? "\t" : " ";
    }
    text += i % 7 == 0 ? ".\n\n" : ".\n";
  }
  return text;
}

class TokenizerTest : public test_support::TempDirTest {};

TEST(SentencePiece, RoundTripsAnyTextAndCountsItsBytes) {
  const std::string model = train_sentencepiece(corpus(3000), {400, "bpe", 1});
  const auto tok = sentencepiece_tokenizer(model, "test.model");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab(), 400);
  // Text it never saw, including characters outside its pieces (byte fallback) and bytes
  // SentencePiece has no piece for.
  const std::string unseen = "Zebras \xE2\x9C\x93 ate 42 quinces\n\n\tthe  jury's verdict: ½\r\n";
  for (const std::string& text : {corpus(200), unseen, std::string("\n"), std::string()}) {
    const std::vector<std::uint16_t> ids = tok->encode(text);
    EXPECT_EQ(tok->decode(ids), text);
    const auto bytes = tok->token_bytes();
    std::uint64_t sum = 0;
    for (const auto id : ids) sum += bytes.at(id);
    EXPECT_EQ(sum, text.size()) << "bits per byte needs every token's byte count";
  }
  // Subwords, not bytes: English it was trained on takes well under one token per byte.
  const std::string seen = corpus(200);
  EXPECT_LT(double(tok->encode(seen).size()), 0.6 * double(seen.size()));
  EXPECT_EQ(tok->token_bytes()[0], 0u) << "<unk> stands for no text";
}

TEST(SentencePiece, UnigramModelsWorkToo) {
  const std::string model = train_sentencepiece(corpus(3000), {330, "unigram", 1});
  const auto tok = sentencepiece_tokenizer(model, "test.model");
  const std::string text = corpus(50);
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
}

TEST(SentencePiece, BadOptionsAndBadModelsAreNamed) {
  EXPECT_THROW(train_sentencepiece("abc", {100, "bpe", 1}), ConfigError);
  EXPECT_THROW(train_sentencepiece("abc", {400, "wordpiece", 1}), ConfigError);
  try {
    sentencepiece_tokenizer("not a model", "bad.model");
    FAIL() << "a garbage model loaded";
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find("bad.model"), std::string::npos) << e.message();
  }
  try {
    (void)load_tokenizer("sentencepiece", "/nonexistent/tokenizer.model");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find("/nonexistent/tokenizer.model"), std::string::npos);
  }
  EXPECT_THROW((void)load_tokenizer("wordpiece", ""), ConfigError);
}

TEST_F(TokenizerTest, PrepareWithSentencePieceRecordsTheModelAndItsHash) {
  const std::string text = corpus(4000);
  { std::ofstream(path("corpus.txt"), std::ios::binary) << text; }
  PrepareOptions opts;
  opts.source = path("corpus.txt");
  opts.out_dir = path("out");
  opts.progress = false;
  opts.tokenizer = "sentencepiece";
  opts.sentencepiece = {512, "bpe", 1};
  const DatasetInfo info = prepare_corpus(opts);
  EXPECT_EQ(info.vocab, 512u);
  EXPECT_EQ(info.tokenizer, "sentencepiece");
  EXPECT_EQ(info.tokenizer_file, path("out/tokenizer.model"));
  EXPECT_NE(info.tokenizer_hash, 0u);

  const DatasetInfo loaded = load_dataset(path("out"));
  EXPECT_EQ(loaded.tokenizer_identity(), info.tokenizer_identity());
  EXPECT_EQ(loaded.tokenizer_file, info.tokenizer_file);
  const auto tok = loaded.load_tokenizer();
  std::string decoded;
  for (const auto& s : loaded.train_shards) decoded += tok->decode(read_shard(s).tokens);
  const std::string val = tok->decode(read_shard(loaded.val_shard).tokens);
  EXPECT_EQ(decoded + val, text) << "the shards hold the whole text, losslessly";
  EXPECT_EQ(loaded.val_text_bytes, val.size());

  // The hash recorded is the file's.
  const std::string on_disk = [&] {
    const auto b = read_file(info.tokenizer_file);
    return std::string(b.begin(), b.end());
  }();
  EXPECT_EQ(tokenizer_hash(on_disk), info.tokenizer_hash);

  // Another vocabulary under the same name: refused, naming the file.
  PrepareOptions other = opts;
  other.out_dir = path("other");
  other.sentencepiece.vocab = 540;
  prepare_corpus(other);
  fs::copy_file(path("other/tokenizer.model"), path("out/tokenizer.model"),
                fs::copy_options::overwrite_existing);
  try {
    (void)load_dataset(path("out"));
    FAIL() << "a dataset whose tokenizer.model changed loaded";
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find("tokenizer.model"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("dataset.toml"), std::string::npos) << e.message();
  }
  fs::remove(path("out/tokenizer.model"));
  EXPECT_THROW((void)load_dataset(path("out")), DataError);

  // A byte preparation over it (forced) removes the stale model.
  opts.tokenizer = "bytes";
  opts.force = true;
  fs::copy_file(path("other/tokenizer.model"), path("out/tokenizer.model"));
  const DatasetInfo bytes = prepare_corpus(opts);
  EXPECT_EQ(bytes.tokenizer, "byte");
  EXPECT_EQ(bytes.tokenizer_identity(), "byte");
  EXPECT_FALSE(fs::exists(path("out/tokenizer.model")));
}

}  // namespace
}  // namespace desloc::data
