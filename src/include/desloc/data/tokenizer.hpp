// The byte-level tokenizer (vocab 256): token id = byte value. Lossless for any input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace desloc::data {

class ByteTokenizer {
 public:
  static constexpr int kVocab = 256;
  std::vector<std::uint16_t> encode(std::string_view text) const;
  // Ids >= 256 (impossible from encode) decode to their low byte, so decoding never throws.
  std::string decode(const std::vector<std::uint16_t>& tokens) const;
};

}  // namespace desloc::data
