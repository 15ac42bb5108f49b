// The byte-level tokenizer: each byte of the UTF-8 text is one token (vocab 256).
#include "desloc/data/tokenizer.hpp"

namespace desloc::data {

std::vector<std::uint16_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<std::uint16_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<std::uint16_t>& tokens) const {
  std::string text(tokens.size(), '\0');
  // Ids >= 256 cannot come from encode(); keep the low byte rather than throw so that decoding
  // a model's sample never fails.
  for (std::size_t i = 0; i < tokens.size(); ++i)
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i] & 0xff));
  return text;
}

}  // namespace desloc::data
