// The SentencePiece tokenizer: training a model with Debian's libsentencepiece, and encoding
// and decoding with it (tokenizer.hpp).
#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <thread>
#include <unordered_map>

#include "desloc/core/error.hpp"
#include "desloc/data/tokenizer.hpp"

namespace desloc::data {
namespace {

// SentencePiece skips training sentences longer than its max_sentence_length; long lines are
// cut at a space (or hard at the limit) so that no text is silently left out of training.
constexpr std::size_t kMaxSentenceBytes = 8192;
// UTF-8 of U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space.
constexpr std::string_view kMetaSpace = "\xE2\x96\x81";

class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view text) : rest_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (!rest_.empty()) {
      std::size_t end = rest_.find('\n');
      std::string_view line = rest_.substr(0, end);
      if (line.size() > kMaxSentenceBytes) {
        const std::size_t space = line.rfind(' ', kMaxSentenceBytes);
        line = line.substr(
            0, space == std::string_view::npos || space == 0 ? kMaxSentenceBytes : space);
        rest_.remove_prefix(line.size());
      } else {
        rest_.remove_prefix(end == std::string_view::npos ? rest_.size() : end + 1);
      }
      if (line.empty()) continue;
      value_.assign(line);
      return;
    }
    done_ = true;
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::string_view rest_;
  std::string value_;
  bool done_ = false;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string_view model, const std::string& origin) : origin_(origin) {
    const auto status = processor_.LoadFromSerializedProto(model);
    if (!status.ok())
      throw DataError(
          fmt::format("'{}' is not a SentencePiece model: {}", origin, status.ToString()));
    const int n = processor_.GetPieceSize();
    if (n > 65536)
      throw DataError(fmt::format(
          "SentencePiece model '{}' has {} pieces; desloc's uint16 tokens hold at most 65536",
          origin, n));
    texts_.resize(static_cast<std::size_t>(n));
    for (int id = 0; id < n; ++id) texts_[static_cast<std::size_t>(id)] = piece_text(id);
    newline_ = processor_.PieceToId("<0x0A>");
    if (!processor_.IsByte(newline_))
      throw DataError(fmt::format(
          "SentencePiece model '{}' has no byte pieces: it was not trained with byte fallback, "
          "so some text would be unencodable; re-run `desloc prepare --tokenizer sentencepiece`",
          origin));
  }
  std::string kind() const override { return "sentencepiece"; }
  int vocab() const override { return static_cast<int>(texts_.size()); }
  std::string token_text(std::uint16_t id) const override {
    return id < texts_.size() ? texts_[id] : std::string();
  }
  // Line by line: no piece holds a line break (training sentences are lines), so encoding the
  // lines apart and joining them with the <0x0A> byte piece is what encoding the whole text
  // would give, without one huge lattice.
  std::vector<std::uint16_t> encode(std::string_view text) const override {
    std::vector<std::uint16_t> tokens;
    tokens.reserve(text.size() / 3);
    std::vector<int> ids;
    while (true) {
      const std::size_t end = text.find('\n');
      const std::string_view line = text.substr(0, end);
      if (!line.empty()) {
        const auto status = processor_.Encode(line, &ids);
        if (!status.ok())
          throw DataError(fmt::format("SentencePiece model '{}' failed to encode: {}", origin_,
                                      status.ToString()));
        for (const int id : ids) tokens.push_back(static_cast<std::uint16_t>(id));
      }
      if (end == std::string_view::npos) break;
      tokens.push_back(static_cast<std::uint16_t>(newline_));
      text.remove_prefix(end + 1);
    }
    return tokens;
  }

 private:
  std::string piece_text(int id) const {
    if (processor_.IsControl(id) || processor_.IsUnknown(id)) return {};
    const std::string& piece = processor_.IdToPiece(id);
    if (processor_.IsByte(id)) {  // "<0xAB>"
      return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    }
    std::string text;
    for (std::size_t i = 0; i < piece.size();) {
      if (std::string_view(piece).substr(i, kMetaSpace.size()) == kMetaSpace) {
        text += ' ';
        i += kMetaSpace.size();
      } else {
        text += piece[i++];
      }
    }
    return text;
  }

  sentencepiece::SentencePieceProcessor processor_;
  std::string origin_;
  std::vector<std::string> texts_;
  int newline_ = -1;
};

}  // namespace

std::string train_sentencepiece(std::string_view text, const SentencePieceOptions& opts) {
  if (opts.vocab < kMinSentencePieceVocab || opts.vocab > kMaxSentencePieceVocab)
    throw ConfigError(fmt::format(
        "prepare: vocab = {} is outside [{}, {}]: a SentencePiece vocabulary holds the 256 "
        "byte pieces, <unk> and its merges, and token ids are uint16",
        opts.vocab, kMinSentencePieceVocab, kMaxSentencePieceVocab));
  if (opts.model_type != "bpe" && opts.model_type != "unigram")
    throw ConfigError(
        fmt::format("prepare: SentencePiece model type '{}' is unknown; use \"bpe\" or \"unigram\"",
                    opts.model_type));
  const int threads = opts.threads > 0
                          ? opts.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Lossless and byte-countable: no normalisation, no whitespace squeezing, no dummy prefix,
  // byte fallback for anything outside the pieces, and no <s> / </s> (nothing emits them).
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", opts.model_type},
      {"vocab_size", std::to_string(opts.vocab)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"unk_id", "0"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "1"},
  };
  LineIterator lines(text);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!status.ok())
    throw DataError(fmt::format(
        "prepare: SentencePiece could not train a {} model of {} pieces on the training text: "
        "{}",
        opts.model_type, opts.vocab, status.ToString()));
  return model;
}

std::unique_ptr<Tokenizer> sentencepiece_tokenizer(std::string_view model,
                                                   const std::string& origin) {
  return std::make_unique<SentencePieceTokenizer>(model, origin);
}

}  // namespace desloc::data
