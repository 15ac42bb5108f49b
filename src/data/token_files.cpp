// Token files read in place (token_files.hpp): the three formats' headers, and a split's files as
// one stream read with pread.
#include "desloc/data/token_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/data/shard.hpp"

namespace desloc::data {
namespace {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

constexpr std::uint64_t kShardHeaderBytes = 32;
constexpr std::uint64_t kLlmcHeaderBytes = 256 * 4;
constexpr std::int32_t kLlmcMagicU16 = 20240520, kLlmcVersionU16 = 1;
constexpr std::int32_t kLlmcMagicU32 = 20240801, kLlmcVersionU32 = 7;
constexpr std::size_t kScanBytes = std::size_t{4} << 20;  // the verification's read buffer

// The arguments' text, one after the other.
template <class... A>
std::string fmt_string(const A&... a) {
  std::string out;
  ((out += fmt::format("{}", a)), ...);
  return out;
}

// What to do about a bad file of `format`.
const char* remedy(TokenFormat format) {
  return format == TokenFormat::kDesloc ? "re-run `desloc prepare` to regenerate it"
                                        : "regenerate it with the tool that wrote it";
}

[[noreturn]] void bad_file(const std::string& path, TokenFormat format, const std::string& what) {
  throw DataError(fmt_string("token file '", path, "' (", to_string(format), " format): ", what,
                             "; ", remedy(format)));
}

// A magic as text, its unprintable bytes as \xNN.
std::string printable_magic(const char* magic) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    const auto c = static_cast<unsigned char>(magic[i]);
    out +=
        c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  return out;
}

// Token k of a buffer of `width`-byte little-endian tokens.
std::uint32_t token_at(const std::uint8_t* buf, std::uint64_t k, std::uint64_t width) {
  std::uint32_t id = 0;
  std::memcpy(&id, buf + k * width, static_cast<std::size_t>(width));
  return id;
}

// Reads exactly `n` bytes at `offset`, or throws DataError naming the file.
void read_at(int fd, const std::string& path, std::uint64_t offset, void* dst, std::size_t n) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw DataError(fmt_string(
          "token file '", path, "': read of ", n, " bytes at offset ", offset, " failed: ",
          got == 0 ? std::string("unexpected end of file") : std::string(std::strerror(errno))));
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
}

int open_file(const std::string& path, std::uint64_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw DataError(fmt_string("token file '", path, "' does not exist or cannot be opened (",
                               std::strerror(errno),
                               "); check the path (data.dir) or re-run `desloc prepare`"));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(fmt_string("token file '", path, "' is not a regular file"));
  }
  size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

// The token bytes after `header` in a file of `size` bytes, as `width`-byte tokens: exactly
// `declared` of them when the header gives a count (which must not overflow a byte count),
// else a whole number of them.
void check_size(const TokenFile& f, std::uint64_t size, std::uint64_t header,
                std::optional<std::uint64_t> declared) {
  if (size < header)
    bad_file(f.path, f.format,
             fmt_string("truncated: the header needs ", header, " bytes but the file has ", size));
  const std::uint64_t payload = size - header;
  const auto width = static_cast<std::uint64_t>(f.width);
  if (!declared) {
    if (payload % width != 0)
      bad_file(
          f.path, f.format,
          fmt_string(payload, " bytes of tokens is not a whole number of ", width, "-byte tokens"));
    return;
  }
  if (*declared > payload / width)
    bad_file(f.path, f.format,
             fmt_string("truncated: the header says ", *declared, " tokens, the file holds ",
                        payload / width));
  if (payload > *declared * width)
    bad_file(f.path, f.format,
             fmt_string(payload - *declared * width, " trailing bytes after the ", *declared,
                        " tokens the header says"));
}

}  // namespace

const char* to_string(TokenFormat f) {
  switch (f) {
    case TokenFormat::kDesloc:
      return "desloc";
    case TokenFormat::kLlmc:
      return "llmc";
    case TokenFormat::kNanogpt:
      return "nanogpt";
  }
  return "?";
}

TokenFile inspect_token_file(const std::string& path, TokenFormat format) {
  std::uint64_t size = 0;
  const int fd = open_file(path, size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  TokenFile f;
  f.path = path;
  f.format = format;
  switch (format) {
    case TokenFormat::kNanogpt:
      f.width = 2;
      check_size(f, size, 0, std::nullopt);
      f.count = size / 2;
      return f;
    case TokenFormat::kLlmc: {
      if (size < kLlmcHeaderBytes)
        bad_file(path, format,
                 fmt_string("truncated: the header needs ", kLlmcHeaderBytes,
                            " bytes but the file has ", size));
      std::array<std::int32_t, 3> head{};
      read_at(fd, path, 0, head.data(), sizeof head);
      if (head[0] == kLlmcMagicU16 && head[1] == kLlmcVersionU16)
        f.width = 2;
      else if (head[0] == kLlmcMagicU32 && head[1] == kLlmcVersionU32)
        f.width = 4;
      else
        bad_file(path, format,
                 fmt_string("magic ", head[0], " version ", head[1], " is neither ", kLlmcMagicU16,
                            " version ", kLlmcVersionU16, " (uint16 tokens) nor ", kLlmcMagicU32,
                            " version ", kLlmcVersionU32, " (uint32 tokens)"));
      if (head[2] < 0) bad_file(path, format, fmt_string("negative token count ", head[2]));
      f.offset = kLlmcHeaderBytes;
      f.count = static_cast<std::uint64_t>(head[2]);
      check_size(f, size, kLlmcHeaderBytes, f.count);
      return f;
    }
    case TokenFormat::kDesloc: {
      if (size < kShardHeaderBytes)
        bad_file(path, format,
                 fmt_string("truncated: the header needs ", kShardHeaderBytes,
                            " bytes but the file has ", size));
      char magic[8];
      read_at(fd, path, 0, magic, sizeof magic);
      if (!std::equal(std::begin(magic), std::end(magic), std::begin(kShardMagic)))
        bad_file(path, format,
                 fmt_string("wrong magic '", printable_magic(magic), "' at offset 0 (expected '",
                            printable_magic(kShardMagic), "'): not a desloc token shard"));
      std::array<std::uint32_t, 4> head{};  // version, dtype, vocab, crc
      read_at(fd, path, 8, head.data(), sizeof head);
      std::uint64_t count = 0;
      read_at(fd, path, 24, &count, sizeof count);
      if (head[0] != kShardVersion)
        bad_file(path, format, fmt_string("unsupported version ", head[0], " at offset 8"));
      if (head[1] == kDtypeU16)
        f.width = 2;
      else if (head[1] == kDtypeU32)
        f.width = 4;
      else
        bad_file(path, format, fmt_string("unknown dtype ", head[1], " at offset 12"));
      f.vocab = head[2];
      if (f.vocab == 0 || (f.width == 2 && f.vocab > 65536))
        bad_file(path, format,
                 fmt_string("vocab ", f.vocab, " at offset 16 does not fit ",
                            f.width == 2 ? "uint16 tokens (must be 1..65536)" : "(must be >= 1)"));
      f.crc = head[3];
      f.offset = kShardHeaderBytes;
      f.count = count;
      check_size(f, size, kShardHeaderBytes, count);
      return f;
    }
  }
  bad_file(path, format, "unknown format");
}

TokenStream::TokenStream(std::vector<TokenFile> files, std::uint32_t vocab, std::string split)
    : files_(std::move(files)), split_(std::move(split)) {
  for (const TokenFile& f : files_) {
    starts_.push_back(total_);
    total_ += f.count;
    std::uint64_t size = 0;
    try {
      fds_.push_back(open_file(f.path, size));
    } catch (...) {
      for (int fd : fds_) ::close(fd);
      throw;
    }
  }
  try {
    for (std::size_t i = 0; i < files_.size(); ++i) verify(i, vocab);
  } catch (...) {
    for (int fd : fds_) ::close(fd);
    throw;
  }
}

TokenStream::~TokenStream() {
  for (int fd : fds_) ::close(fd);
}

void TokenStream::verify(std::size_t i, std::uint32_t vocab) const {
  const TokenFile& f = files_[i];
  if (f.format == TokenFormat::kDesloc && f.vocab != vocab)
    throw DataError(fmt_string("token shard '", f.path, "' was written with vocab ", f.vocab,
                               " but the dataset's ", split_, " split declares vocab ", vocab,
                               "; re-run `desloc prepare` so shards and dataset.toml agree"));
  std::vector<std::uint8_t> buf(kScanBytes);
  std::uint32_t crc = 0;
  const auto width = static_cast<std::uint64_t>(f.width);
  for (std::uint64_t done = 0; done < f.count;) {
    const std::uint64_t n = std::min<std::uint64_t>(f.count - done, kScanBytes / width);
    const std::size_t bytes = static_cast<std::size_t>(n * width);
    read_at(fds_[i], f.path, f.offset + done * width, buf.data(), bytes);
    crc = crc32c({buf.data(), bytes}, crc);
    for (std::uint64_t k = 0; k < n; ++k) {
      const std::uint32_t id = token_at(buf.data(), k, width);
      if (id >= vocab)
        bad_file(
            f.path, f.format,
            fmt_string(
                "token ", done + k, " (offset ", f.offset + (done + k) * width, ") has id ", id,
                " >= vocab ", vocab,
                f.format == TokenFormat::kDesloc ? "" : " (model.vocab: these files record none)"));
    }
    done += n;
  }
  if (f.format == TokenFormat::kDesloc && crc != f.crc)
    bad_file(f.path, f.format,
             fmt_string("CRC32C mismatch over its ", f.count * width,
                        " token bytes at offset 32 (header ", f.crc, ", computed ", crc,
                        "): the file is corrupt"));
}

void TokenStream::read(std::uint64_t start, std::span<std::int32_t> out) const {
  if (start > total_ || out.size() > total_ - start)
    throw Error(fmt_string("token stream (", split_, "): tokens [", start, ", ", start + out.size(),
                           ") pass its end at ", total_));
  // The file holding `start`: the last whose first token is at or before it.
  std::size_t i = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) -
                                           starts_.begin() - 1);
  std::uint64_t pos = start - starts_[i];
  std::size_t filled = 0;
  std::array<std::uint8_t, 4096> buf;
  while (filled < out.size()) {
    const TokenFile& f = files_[i];
    if (pos >= f.count) {  // this file is used up (or empty): the next one
      ++i;
      pos = 0;
      continue;
    }
    const auto width = static_cast<std::uint64_t>(f.width);
    const std::uint64_t n =
        std::min<std::uint64_t>({out.size() - filled, f.count - pos, buf.size() / width});
    read_at(fds_[i], f.path, f.offset + pos * width, buf.data(),
            static_cast<std::size_t>(n * width));
    for (std::uint64_t k = 0; k < n; ++k)
      out[filled + k] = static_cast<std::int32_t>(token_at(buf.data(), k, width));
    filled += static_cast<std::size_t>(n);
    pos += n;
  }
}

DatasetInfo external_dataset(const std::string& dir, TokenFormat format, std::uint32_t vocab) {
  namespace fs = std::filesystem;
  if (format == TokenFormat::kDesloc)
    throw Error("external_dataset: desloc's own shards are described by dataset.toml");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError(fmt_string("data.dir '", dir, "' is not a directory (data.format = \"",
                               to_string(format), "\")"));
  DatasetInfo info;
  info.format = format;
  info.vocab = vocab;
  info.tokenizer = to_string(format);
  info.source = fmt_string(dir, " (", to_string(format), " token files)");
  if (format == TokenFormat::kNanogpt) {
    info.train_shards = {(fs::path(dir) / "train.bin").string()};
    info.val_shard = (fs::path(dir) / "val.bin").string();
  } else {
    std::vector<std::string> train, val;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || !name.ends_with(".bin")) continue;
      if (name.find("_train") != std::string::npos) train.push_back(e.path().string());
      if (name.find("_val") != std::string::npos) val.push_back(e.path().string());
    }
    std::sort(train.begin(), train.end());
    std::sort(val.begin(), val.end());
    if (train.empty())
      throw DataError(
          fmt_string("data.dir '", dir, "' holds no llm.c training files (*_train*.bin)"));
    if (val.size() != 1)
      throw DataError(fmt_string("data.dir '", dir, "' holds ", val.size(),
                                 " llm.c validation files (*_val*.bin); desloc evaluates on one"));
    info.train_shards = std::move(train);
    info.val_shard = val[0];
  }
  for (const std::string& path : info.train_shards)
    info.train_tokens += inspect_token_file(path, format).count;
  info.val_tokens = inspect_token_file(info.val_shard, format).count;
  return info;
}

namespace {
std::shared_ptr<const TokenStream> open_split(const std::vector<std::string>& paths,
                                              const DatasetInfo& data, const char* split) {
  std::vector<TokenFile> files;
  for (const std::string& path : paths) files.push_back(inspect_token_file(path, data.format));
  return std::make_shared<const TokenStream>(std::move(files), data.vocab, split);
}
}  // namespace

std::shared_ptr<const TokenStream> open_train_tokens(const DatasetInfo& data) {
  if (data.train_shards.empty())
    throw DataError("the dataset lists no training files; re-run `desloc prepare`");
  return open_split(data.train_shards, data, "train");
}

std::shared_ptr<const TokenStream> open_val_tokens(const DatasetInfo& data) {
  if (data.val_shard.empty())
    throw DataError("the dataset has no validation file; re-run `desloc prepare`");
  return open_split({data.val_shard}, data, "validation");
}

}  // namespace desloc::data
