// Checkpoint serialisation with integrity checks, and discovery of the newest valid one.
#include "desloc/train/checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string_view>

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
  const std::size_t n = ck.workers.empty() ? 0 : ck.workers[0].params.size();
  for (const auto& w : ck.workers)
    if (w.params.size() != n || w.u.size() != n || w.v.size() != n)
      throw Error("checkpoint buffers differ in size; refusing to write " + path);
  if (ck.outer_ref.size() != ck.outer_momentum.size())
    throw Error("checkpoint outer-optimizer buffers differ in size; refusing to write " + path);
  ByteWriter payload;
  payload.put<std::uint64_t>(ck.config_hash);
  payload.put<std::int64_t>(ck.step);
  payload.put<std::uint64_t>(ck.tokens_seen);
  payload.put<std::uint64_t>(n);
  payload.put<std::uint32_t>(static_cast<std::uint32_t>(ck.workers.size()));
  for (const auto& w : ck.workers) {
    payload.put<std::int64_t>(w.optim_t);
    payload.put<std::uint64_t>(w.loader.epoch);
    payload.put<std::uint64_t>(w.loader.cursor);
    payload.put_span<float>(w.params);
    payload.put_span<float>(w.u);
    payload.put_span<float>(w.v);
  }
  payload.put<std::uint64_t>(ck.outer_ref.size());
  payload.put_span<float>(ck.outer_ref);
  payload.put_span<float>(ck.outer_momentum);

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
  ck.tokens_seen = r.get<std::uint64_t>("tokens_seen");
  const auto n = r.get<std::uint64_t>("parameter count");
  const auto workers = r.get<std::uint32_t>("worker count");
  // Each worker needs 24 counter bytes + 3n floats; check before allocating anything.
  const std::uint64_t per_worker = 24 + n * 3 * sizeof(float);
  if (n > (std::uint64_t(1) << 40) || workers == 0 || per_worker * workers > r.remaining())
    throw DataError(
        fmt::format("'{}' is inconsistent: {} workers x {} parameters need {} bytes, {} remain",
                    path, workers, n, per_worker * workers, r.remaining()));
  ck.workers.resize(workers);
  for (auto& w : ck.workers) {
    w.optim_t = r.get<std::int64_t>("optim_t");
    if (w.optim_t < 0) throw DataError("'" + path + "' holds a negative optimizer step counter");
    w.loader.epoch = r.get<std::uint64_t>("loader.epoch");
    w.loader.cursor = r.get<std::uint64_t>("loader.cursor");
    w.params.resize(n);
    w.u.resize(n);
    w.v.resize(n);
    r.get_span<float>(w.params, "params");
    r.get_span<float>(w.u, "u");
    r.get_span<float>(w.v, "v");
  }
  const auto outer_n = r.get<std::uint64_t>("outer optimizer size");
  if (outer_n * 2 * sizeof(float) != r.remaining())
    throw DataError(fmt::format(
        "'{}' is inconsistent: outer optimizer of {} parameters needs {} bytes, {} remain", path,
        outer_n, outer_n * 2 * sizeof(float), r.remaining()));
  ck.outer_ref.resize(outer_n);
  ck.outer_momentum.resize(outer_n);
  r.get_span<float>(ck.outer_ref, "outer_ref");
  r.get_span<float>(ck.outer_momentum, "outer_momentum");
  if (ck.step < 0) throw DataError("'" + path + "' holds a negative step counter");
  return ck;
}

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / fmt::format("step_{:08d}.ckpt", step)).string();
}

std::optional<FoundCheckpoint> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  // Names are "step_<digits>.ckpt"; anything else in the directory (temporary files of an
  // interrupted write, user files) is ignored.
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    constexpr std::string_view kPrefix = "step_", kSuffix = ".ckpt";
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    const std::string digits =
        name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    found.emplace_back(std::stoll(digits), entry.path().string());
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
