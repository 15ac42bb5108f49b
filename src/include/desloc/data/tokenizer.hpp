// Tokenizers: text <-> uint16 token ids.
//   byte           each byte of the text is one token (vocab 256); lossless for any input.
//   sentencepiece  a SentencePiece model (BPE or unigram, Debian's libsentencepiece) trained by
//                  `desloc prepare` on the training split, with byte fallback, the identity
//                  normaliser and no dummy prefix, so that decode(encode(text)) == text for any
//                  valid UTF-8 text and every token stands for a known number of bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace desloc::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "byte" | "sentencepiece"
  virtual int vocab() const = 0;
  virtual std::vector<std::uint16_t> encode(std::string_view text) const = 0;
  // The bytes one token stands for; the concatenation over a sequence is its decoding, so a
  // sampler can stream text token by token. Empty for control tokens (<unk>).
  virtual std::string token_text(std::uint16_t id) const = 0;
  std::string decode(std::span<const std::uint16_t> tokens) const;
  // token_text(id).size() for every id: the denominator of bits per byte.
  std::vector<std::uint32_t> token_bytes() const;
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int kVocab = 256;
  std::string kind() const override { return "byte"; }
  int vocab() const override { return kVocab; }
  std::vector<std::uint16_t> encode(std::string_view text) const override;
  // Ids >= 256 (impossible from encode) stand for their low byte, so decoding never throws.
  std::string token_text(std::uint16_t id) const override;
};

struct SentencePieceOptions {
  int vocab = 4096;                // pieces, including the 256 byte pieces and <unk>
  std::string model_type = "bpe";  // "bpe" | "unigram"
  int threads = 0;                 // trainer threads; 0 = hardware concurrency
};

// The smallest and largest vocabularies `desloc prepare` accepts for SentencePiece: the 256
// byte pieces, <unk> and room for merges; ids must fit uint16.
inline constexpr int kMinSentencePieceVocab = 320;
inline constexpr int kMaxSentencePieceVocab = 65536;

// Trains a SentencePiece model on `text` (one sentence per line; lines longer than the
// trainer's limit are skipped by SentencePiece) and returns the serialised model, the bytes of
// a `.model` file. Throws ConfigError for bad options and DataError (with SentencePiece's own
// message) when training fails.
std::string train_sentencepiece(std::string_view text, const SentencePieceOptions& opts);

// A tokenizer from a serialised SentencePiece model; `origin` names it in errors.
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(std::string_view model,
                                                   const std::string& origin);

// The tokenizer a dataset or checkpoint names: "byte" (file ignored) or "sentencepiece" (the
// model file at `file`). When `expected_hash` is not 0 the file's tokenizer_hash() must equal
// it. Throws DataError naming the file for a missing, unreadable or different model, and
// ConfigError for an unknown kind.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& kind, const std::string& file,
                                          std::uint64_t expected_hash = 0);

// FNV-1a 64 of a tokenizer model file's bytes; 0 never occurs for a real file (it is mapped
// to 1), so 0 can mean "the byte tokenizer, no file".
std::uint64_t tokenizer_hash(std::string_view model_bytes);

}  // namespace desloc::data
