// The byte tokenizer, the parts every tokenizer shares, and loading a named tokenizer.
#include "desloc/data/tokenizer.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/hash.hpp"

namespace desloc::data {

std::string Tokenizer::decode(std::span<const std::uint16_t> tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (const auto t : tokens) text += token_text(t);
  return text;
}

std::vector<std::uint32_t> Tokenizer::token_bytes() const {
  std::vector<std::uint32_t> bytes(static_cast<std::size_t>(vocab()));
  for (std::size_t id = 0; id < bytes.size(); ++id)
    bytes[id] = static_cast<std::uint32_t>(token_text(static_cast<std::uint16_t>(id)).size());
  return bytes;
}

std::vector<std::uint16_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<std::uint16_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::token_text(std::uint16_t id) const {
  return std::string(1, static_cast<char>(static_cast<unsigned char>(id & 0xff)));
}

std::uint64_t tokenizer_hash(std::string_view model_bytes) {
  const std::uint64_t h = fnv1a64(model_bytes);
  return h == 0 ? 1 : h;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& kind, const std::string& file,
                                          std::uint64_t expected_hash) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "nanogpt" || kind == "llmc")
    throw ConfigError(fmt::format(
        "the model was trained on {} token files, whose tokenizer desloc does not have; text in "
        "and out needs a dataset `desloc prepare` wrote",
        kind));
  if (kind != "sentencepiece")
    throw ConfigError(fmt::format(
        "tokenizer '{}' is unknown; desloc knows \"byte\" and \"sentencepiece\"", kind));
  std::error_code ec;
  if (file.empty() || !std::filesystem::is_regular_file(file, ec))
    throw DataError(fmt::format(
        "SentencePiece model '{}' not found; it is written by `desloc prepare --tokenizer "
        "sentencepiece` beside the dataset's shards (pass --tokenizer FILE if it moved)",
        file));
  const std::vector<std::uint8_t> bytes = read_file(file);
  const std::string_view model(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (expected_hash != 0 && tokenizer_hash(model) != expected_hash)
    throw DataError(fmt::format(
        "SentencePiece model '{}' has hash {:016x} but {:016x} was recorded with the data or "
        "checkpoint: it is another vocabulary, and a model trained on one cannot read the other",
        file, tokenizer_hash(model), expected_hash));
  return sentencepiece_tokenizer(model, file);
}

}  // namespace desloc::data
