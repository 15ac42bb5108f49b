// Checkpoint serialisation with integrity checks, and discovery of the newest valid one.
#include "desloc/train/checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/core/log.hpp"

namespace desloc::train {
namespace fs = std::filesystem;

namespace {
constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 4;
}

void save_checkpoint(const std::string& path, const Checkpoint& ck) {
  if (ck.u.size() != ck.params.size() || ck.v.size() != ck.params.size())
    throw Error("checkpoint buffers differ in size; refusing to write " + path);
  ByteWriter payload;
  payload.put<std::uint64_t>(ck.config_hash);
  payload.put<std::int64_t>(ck.step);
  payload.put<std::int64_t>(ck.optim_t);
  payload.put<std::uint64_t>(ck.loader.epoch);
  payload.put<std::uint64_t>(ck.loader.cursor);
  payload.put<std::uint64_t>(ck.tokens_seen);
  payload.put<std::uint64_t>(ck.params.size());
  payload.put_span<float>(ck.params);
  payload.put_span<float>(ck.u);
  payload.put_span<float>(ck.v);

  ByteWriter file;
  file.bytes().reserve(kHeaderBytes + payload.bytes().size());
  file.put_span<char>(std::span<const char>(kCheckpointMagic, 8));
  file.put<std::uint32_t>(kCheckpointVersion);
  file.put<std::uint32_t>(0);
  file.put<std::uint64_t>(payload.bytes().size());
  file.put<std::uint32_t>(crc32c(payload.bytes()));
  file.bytes().insert(file.bytes().end(), payload.bytes().begin(), payload.bytes().end());
  write_file_atomic(path, file.bytes());
}

Checkpoint load_checkpoint(const std::string& path) {
  const std::vector<std::uint8_t> bytes = read_file(path);
  ByteReader header(bytes, path);
  char magic[8];
  header.get_span<char>(std::span<char>(magic, 8), "magic");
  if (std::memcmp(magic, kCheckpointMagic, 8) != 0)
    throw DataError("'" + path + "' is not a desloc checkpoint (wrong magic bytes)");
  const auto version = header.get<std::uint32_t>("version");
  if (version != kCheckpointVersion)
    throw DataError(fmt::format("'{}' has checkpoint version {}; this desloc reads version {}",
                                path, version, kCheckpointVersion));
  header.get<std::uint32_t>("reserved");
  const auto payload_bytes = header.get<std::uint64_t>("payload size");
  const auto crc = header.get<std::uint32_t>("crc32c");
  if (header.remaining() != payload_bytes)
    throw DataError(fmt::format("'{}' is {}: the header promises {} payload bytes but {} follow",
                                path,
                                header.remaining() < payload_bytes ? "truncated" : "oversized",
                                payload_bytes, header.remaining()));
  const std::span<const std::uint8_t> payload(bytes.data() + kHeaderBytes, payload_bytes);
  if (crc32c(payload) != crc) throw DataError("'" + path + "' is corrupt: payload CRC32C mismatch");

  ByteReader r(payload, path);
  Checkpoint ck;
  ck.config_hash = r.get<std::uint64_t>("config_hash");
  ck.step = r.get<std::int64_t>("step");
  ck.optim_t = r.get<std::int64_t>("optim_t");
  ck.loader.epoch = r.get<std::uint64_t>("loader.epoch");
  ck.loader.cursor = r.get<std::uint64_t>("loader.cursor");
  ck.tokens_seen = r.get<std::uint64_t>("tokens_seen");
  const auto n = r.get<std::uint64_t>("parameter count");
  if (n * 3 * sizeof(float) != r.remaining())
    throw DataError(
        fmt::format("'{}' is inconsistent: {} parameters need {} bytes of state, found {}", path, n,
                    n * 3 * sizeof(float), r.remaining()));
  ck.params.resize(n);
  ck.u.resize(n);
  ck.v.resize(n);
  r.get_span<float>(ck.params, "params");
  r.get_span<float>(ck.u, "u");
  r.get_span<float>(ck.v, "v");
  if (ck.step < 0 || ck.optim_t < 0)
    throw DataError("'" + path + "' holds a negative step counter");
  return ck;
}

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / fmt::format("step_{:08d}.ckpt", step)).string();
}

std::optional<FoundCheckpoint> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  static const std::regex kName(R"(step_(\d+)\.ckpt)");
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kName))
      found.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  for (const auto& [step, path] : found) {
    try {
      return FoundCheckpoint{path, load_checkpoint(path)};
    } catch (const DataError& e) {
      log::warn("skipping checkpoint {}: {}", path, e.message());
    }
  }
  return std::nullopt;
}

}  // namespace desloc::train
