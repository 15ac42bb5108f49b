// Token files read in place. A split (training or validation) is the concatenation of one or
// more files in one of three formats:
//   desloc   the shards `desloc prepare` writes (shard.hpp): a 32-byte header with the vocab and
//            a CRC32C, then uint16 (dtype 1) or uint32 (dtype 2) tokens;
//   llmc     llm.c's .bin files: 256 int32 (magic 20240520 with version 1 for uint16 tokens,
//            magic 20240801 with version 7 for uint32; [2] = the token count), then the tokens;
//   nanogpt  nanoGPT's train.bin / val.bin: raw little-endian uint16 tokens, no header.
// Nothing is held in memory: each read is a pread of the tokens asked for, so a rank's memory
// does not grow with the data set and the kernel's page cache serves every process on a host
// alike. (Mapping the files would count every page an epoch touched in each rank's RSS.)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace desloc::data {

enum class TokenFormat : std::uint8_t { kDesloc, kLlmc, kNanogpt };
const char* to_string(TokenFormat f);

// One file's tokens: where they start, how many and how wide.
struct TokenFile {
  std::string path;
  TokenFormat format = TokenFormat::kDesloc;
  std::uint64_t offset = 0;  // bytes before the first token
  std::uint64_t count = 0;   // tokens
  int width = 2;             // bytes per token: 2 (uint16) or 4 (uint32)
  std::uint32_t vocab = 0;   // a desloc shard's declared vocab; 0 where the format has none
  std::uint32_t crc = 0;     // a desloc shard's CRC32C of its token bytes
};

// Reads `path`'s header and checks its size against it. Throws DataError naming the file and
// what is wrong (missing, wrong magic or version, truncated, trailing bytes, an odd size).
TokenFile inspect_token_file(const std::string& path, TokenFormat format);

// A split's files as one stream of tokens. The constructor opens every file and reads each once
// in bounded buffers: a desloc shard's CRC32C and declared vocab are checked, and every token
// id must be below `vocab` (DataError naming the file, the token's index and its offset).
class TokenStream {
 public:
  TokenStream(std::vector<TokenFile> files, std::uint32_t vocab, std::string split);
  ~TokenStream();
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  std::uint64_t size() const { return total_; }
  // Tokens [start, start + out.size()) as int32, across file boundaries. Throws Error when the
  // range passes the end, DataError when a read fails (naming the file).
  void read(std::uint64_t start, std::span<std::int32_t> out) const;

 private:
  void verify(std::size_t i, std::uint32_t vocab) const;
  std::vector<TokenFile> files_;
  std::vector<int> fds_;
  std::vector<std::uint64_t> starts_;  // the stream position of each file's first token
  std::uint64_t total_ = 0;
  std::string split_;
};

}  // namespace desloc::data
