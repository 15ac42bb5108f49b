// Checkpoint serialisation with integrity checks, and discovery of the newest valid one.
#include "desloc/train/checkpoint.hpp"

#include <fmt/format.h>

#include <string.h>  // strnlen
#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/core/log.hpp"

namespace desloc::train {
namespace fs = std::filesystem;

namespace {
constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 4;
constexpr std::size_t kPayloadHeadBytes = 8 + 8 + 8 + 8 + 4;
constexpr std::uint64_t kWorkerCounterBytes = 8 + 8 + 8;  // optim_t, loader.epoch, .cursor
constexpr std::size_t kStreamBlockBytes = std::size_t(1) << 20;

// Version 3 ends the payload with the writer's name in a fixed field (NUL-padded).
constexpr std::size_t kWriterBytes = 64;

std::string writer_from(std::span<const std::uint8_t> field) {
  const auto* c = reinterpret_cast<const char*>(field.data());
  return std::string(c, strnlen(c, field.size()));
}

// Version 5 puts the model description before the writer's name, in fixed-size fields.
constexpr std::size_t kTokenizerKindBytes = 16;
constexpr std::size_t kTokenizerFileBytes = 512;
constexpr std::size_t kModelBytes = 5 * 4 + kTokenizerKindBytes + 8 + kTokenizerFileBytes;

// Version 6 puts the period switches before the model description: a count and a fixed table.
constexpr std::size_t kSwitchBytes = 8 + sync::kMaxPeriodSwitches * 4 * 8;

// Version 7 puts the run id before the period switches.
constexpr std::size_t kRunIdBytes = 8;

struct FileHeader {
  std::uint32_t version = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t crc = 0;
  std::uint64_t model_bytes() const { return version >= 5 ? kModelBytes : 0; }
  std::uint64_t switch_bytes() const { return version >= 6 ? kSwitchBytes : 0; }
  std::uint64_t run_id_bytes() const { return version >= 7 ? kRunIdBytes : 0; }
  std::uint64_t trailer_bytes() const {
    return (version >= 3 ? kWriterBytes : 0) + model_bytes() + switch_bytes() + run_id_bytes();
  }
};

void put_switches(ByteWriter& w, const std::vector<sync::PeriodSwitch>& switches) {
  w.put<std::uint64_t>(switches.size());
  for (std::size_t i = 0; i < sync::kMaxPeriodSwitches; ++i) {
    const sync::PeriodSwitch sw = i < switches.size() ? switches[i] : sync::PeriodSwitch{};
    for (const std::int64_t v : {sw.after, sw.kx, sw.ku, sw.kv}) w.put<std::int64_t>(v);
  }
}

std::vector<sync::PeriodSwitch> get_switches(ByteReader& r, const std::string& path) {
  const auto n = r.get<std::uint64_t>("period switches");
  if (n > sync::kMaxPeriodSwitches)
    throw DataError(fmt::format("'{}' holds {} period switches, at most {}", path, n,
                                sync::kMaxPeriodSwitches));
  std::vector<sync::PeriodSwitch> out;
  for (std::size_t i = 0; i < sync::kMaxPeriodSwitches; ++i) {
    sync::PeriodSwitch sw;
    for (std::int64_t* v : {&sw.after, &sw.kx, &sw.ku, &sw.kv})
      *v = r.get<std::int64_t>("period switch");
    if (i >= n) continue;
    if (sw.after < 1 || sw.kx < 1 || sw.ku < 0 || sw.kv < 0 ||
        (!out.empty() && sw.after <= out.back().after))
      throw DataError(
          fmt::format("'{}' holds an impossible period switch {} (after step {}, "
                      "periods {}, {}, {})",
                      path, i + 1, sw.after, sw.kx, sw.ku, sw.kv));
    out.push_back(sw);
  }
  return out;
}

template <std::size_t N>
void put_text(ByteWriter& w, const std::string& text) {
  std::array<char, N> field{};
  std::memcpy(field.data(), text.data(), std::min(text.size(), N - 1));
  w.put_span<char>(field);
}

void put_model(ByteWriter& w, const std::optional<CheckpointModel>& m) {
  const CheckpointModel d = m.value_or(CheckpointModel{});
  for (const int v :
       {d.model.vocab, d.model.context, d.model.layers, d.model.heads, d.model.d_model})
    w.put<std::int32_t>(m ? v : 0);
  put_text<kTokenizerKindBytes>(w, m ? d.tokenizer : std::string());
  w.put<std::uint64_t>(d.tokenizer_hash);
  put_text<kTokenizerFileBytes>(
      w, d.tokenizer_file.size() < kTokenizerFileBytes ? d.tokenizer_file : std::string());
}

// nullopt when the writer had no model description (all sizes 0).
std::optional<CheckpointModel> get_model(ByteReader& r, const std::string& path) {
  CheckpointModel m;
  for (int* v :
       {&m.model.vocab, &m.model.context, &m.model.layers, &m.model.heads, &m.model.d_model})
    *v = r.get<std::int32_t>("model size");
  std::array<std::uint8_t, kTokenizerKindBytes> kind{};
  r.get_span<std::uint8_t>(kind, "tokenizer");
  m.tokenizer_hash = r.get<std::uint64_t>("tokenizer hash");
  std::array<std::uint8_t, kTokenizerFileBytes> file{};
  r.get_span<std::uint8_t>(file, "tokenizer file");
  if (m.model.vocab == 0 && m.model.layers == 0 && m.model.d_model == 0) return std::nullopt;
  m.tokenizer = writer_from(kind);
  m.tokenizer_file = writer_from(file);
  try {
    m.model.validate();
  } catch (const Error& e) {
    throw DataError(fmt::format("'{}' describes an impossible model: {}", path, e.message()));
  }
  // "nanogpt" and "llmc": another tool's tokens (data.format), whose tokenizer desloc lacks.
  if (m.tokenizer != "byte" && m.tokenizer != "sentencepiece" && m.tokenizer != "nanogpt" &&
      m.tokenizer != "llmc")
    throw DataError(fmt::format("'{}' names an unknown tokenizer '{}'", path, m.tokenizer));
  return m;
}

// Version 4's compressed-state section: six sizes, then the references and the sites' error
// feedback.
constexpr std::uint64_t kCodecHeadBytes = 6 * 8;
struct CodecHead {
  std::array<std::uint64_t, 3> ref_n{}, ef_n{};
  std::uint64_t data_bytes(std::uint32_t sites) const {
    std::uint64_t floats = 0;
    for (std::size_t k = 0; k < 3; ++k) floats += ref_n[k] + std::uint64_t(sites) * ef_n[k];
    return floats * sizeof(float);
  }
};

// Reads the sizes and checks them against n, the sites and the bytes that remain for the
// section's data (the writer's name excluded).
CodecHead read_codec_head(ByteReader& r, const std::string& path, std::uint64_t n,
                          std::uint32_t sites, std::uint64_t data_remaining) {
  CodecHead h;
  for (auto& v : h.ref_n) v = r.get<std::uint64_t>("codec reference size");
  for (auto& v : h.ef_n) v = r.get<std::uint64_t>("codec feedback size");
  for (std::size_t k = 0; k < 3; ++k)
    if ((h.ref_n[k] != 0 && h.ref_n[k] != n) || (h.ef_n[k] != 0 && h.ef_n[k] != h.ref_n[k]))
      throw DataError(fmt::format(
          "'{}' is inconsistent: a compressed state's reference of {} and feedback of {} "
          "values for a model of {}",
          path, h.ref_n[k], h.ef_n[k], n));
  if (h.data_bytes(sites) != data_remaining)
    throw DataError(
        fmt::format("'{}' is inconsistent: the compressed states need {} bytes, {} remain", path,
                    h.data_bytes(sites), data_remaining));
  return h;
}

// A checkpoint path must name a regular file: a directory of that name would read as a huge
// file (and be in the way of the next write).
void check_regular_file(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    throw DataError("cannot open '" + path + "': no such file or not readable");
  if (!fs::is_regular_file(status))
    throw DataError(fmt::format("'{}' is a {}, not a checkpoint file; move it out of the way", path,
                                fs::is_directory(status) ? "directory" : "special file"));
}

// `header` is the file's first min(file_bytes, kHeaderBytes) bytes.
FileHeader check_header(const std::string& path, std::span<const std::uint8_t> header,
                        std::uint64_t file_bytes) {
  ByteReader r(header, path);
  char magic[8];
  r.get_span<char>(std::span<char>(magic, 8), "magic");
  if (std::memcmp(magic, kCheckpointMagic, 8) != 0)
    throw DataError("'" + path + "' is not a desloc checkpoint (wrong magic bytes)");
  const auto version = r.get<std::uint32_t>("version");
  if (version < 2 || version > kCheckpointVersion)
    throw DataError(
        fmt::format("'{}' has checkpoint version {}; this desloc reads versions 2 to {}", path,
                    version, kCheckpointVersion));
  r.get<std::uint32_t>("reserved");
  FileHeader h;
  h.version = version;
  h.payload_bytes = r.get<std::uint64_t>("payload size");
  h.crc = r.get<std::uint32_t>("crc32c");
  const std::uint64_t follow = file_bytes - kHeaderBytes;
  if (follow != h.payload_bytes)
    throw DataError(fmt::format("'{}' is {}: the header promises {} payload bytes but {} follow",
                                path, follow < h.payload_bytes ? "truncated" : "oversized",
                                h.payload_bytes, follow));
  return h;
}

struct PayloadHead {
  std::uint64_t config_hash = 0;
  std::int64_t step = 0;
  std::uint64_t tokens_seen = 0;
  std::uint64_t n = 0;  // parameters per buffer
  std::uint32_t sites = 0;
};

PayloadHead read_payload_head(ByteReader& r) {
  PayloadHead h;
  h.config_hash = r.get<std::uint64_t>("config_hash");
  h.step = r.get<std::int64_t>("step");
  h.tokens_seen = r.get<std::uint64_t>("tokens_seen");
  h.n = r.get<std::uint64_t>("parameter count");
  h.sites = r.get<std::uint32_t>("site count");
  return h;
}

// Checks that the sites fit in the `remaining` payload bytes before anything is allocated;
// returns the bytes per site (24 counter bytes + 3n floats).
std::uint64_t check_workers(const std::string& path, const PayloadHead& h,
                            std::uint64_t remaining) {
  const std::uint64_t per_worker = kWorkerCounterBytes + h.n * 3 * sizeof(float);
  if (h.n > (std::uint64_t(1) << 40) || h.sites == 0 || per_worker > remaining / h.sites)
    throw DataError(fmt::format(
        "'{}' is inconsistent: {} sites x {} parameters need {} bytes, {} remain", path, h.sites,
        h.n, h.n > (std::uint64_t(1) << 40) ? 0 : per_worker * h.sites, remaining));
  return per_worker;
}

void check_outer(const std::string& path, std::uint64_t outer_n, std::uint64_t remaining) {
  if (outer_n > remaining || outer_n * 2 * sizeof(float) != remaining)
    throw DataError(fmt::format(
        "'{}' is inconsistent: outer optimizer of {} parameters needs {} bytes, {} remain", path,
        outer_n, outer_n * 2 * sizeof(float), remaining));
}

// The outer optimizer's buffers and what follows them: `remaining` bytes after its size
// field. Before version 4 the buffers fill it up to the writer's name; from version 4 the
// compressed-state section follows them. Returns the bytes after the buffers.
std::uint64_t check_outer_section(const std::string& path, const FileHeader& header,
                                  std::uint64_t outer_n, std::uint64_t remaining) {
  const std::uint64_t room = remaining - header.trailer_bytes();  // the caller checked >= 0
  if (header.version < 4) {
    check_outer(path, outer_n, room);
    return header.trailer_bytes();
  }
  if (outer_n > room || outer_n * 2 * sizeof(float) + kCodecHeadBytes > room)
    throw DataError(fmt::format(
        "'{}' is inconsistent: outer optimizer of {} parameters and the compressed-state "
        "sizes need {} bytes, {} remain",
        path, outer_n, outer_n > room ? 0 : outer_n * 2 * sizeof(float) + kCodecHeadBytes, room));
  return remaining - outer_n * 2 * sizeof(float);
}

// Reads exactly `out.size()` bytes at `offset`, or throws DataError naming the path.
void read_at(std::ifstream& in, const std::string& path, std::uint64_t offset,
             std::span<std::uint8_t> out) {
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in ||
      !in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size())))
    throw DataError(
        fmt::format("short read from '{}': {} bytes at offset {}", path, out.size(), offset));
}

// "step_<digits>.ckpt" files in dir, newest step first; nothing if dir is absent.
std::vector<std::pair<std::int64_t, std::string>> checkpoint_files(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  // Anything else in the directory (temporary files of an interrupted write, user files) is
  // ignored.
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
  return found;
}
}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& ck) {
  const std::size_t n = ck.sites.empty() ? 0 : ck.sites[0].params.size();
  for (const auto& w : ck.sites)
    if (w.params.size() != n || w.u.size() != n || w.v.size() != n)
      throw Error("checkpoint buffers differ in size; refusing to write " + path);
  if (ck.outer_ref.size() != ck.outer_momentum.size())
    throw Error("checkpoint outer-optimizer buffers differ in size; refusing to write " + path);
  if (ck.switches.size() > sync::kMaxPeriodSwitches)
    throw Error(fmt::format("checkpoint of {} period switches (at most {}); refusing to write {}",
                            ck.switches.size(), sync::kMaxPeriodSwitches, path));
  for (std::size_t k = 0; k < 3; ++k) {
    const std::size_t ef = ck.sites.empty() ? 0 : ck.sites[0].codec_feedback[k].size();
    bool ok = ck.codec_ref[k].empty() || ck.codec_ref[k].size() == n;
    for (const auto& w : ck.sites)
      ok = ok && w.codec_feedback[k].size() == ef && (ef == 0 || ef == ck.codec_ref[k].size());
    if (!ok)
      throw Error("checkpoint compressed-state buffers differ in size; refusing to write " + path);
  }
  ByteWriter payload;
  payload.put<std::uint64_t>(ck.config_hash);
  payload.put<std::int64_t>(ck.step);
  payload.put<std::uint64_t>(ck.tokens_seen);
  payload.put<std::uint64_t>(n);
  payload.put<std::uint32_t>(static_cast<std::uint32_t>(ck.sites.size()));
  for (const auto& w : ck.sites) {
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
  for (const auto& r : ck.codec_ref) payload.put<std::uint64_t>(r.size());
  for (std::size_t k = 0; k < 3; ++k)
    payload.put<std::uint64_t>(ck.sites.empty() ? 0 : ck.sites[0].codec_feedback[k].size());
  for (const auto& r : ck.codec_ref) payload.put_span<float>(r);
  for (std::size_t k = 0; k < 3; ++k)
    for (const auto& w : ck.sites) payload.put_span<float>(w.codec_feedback[k]);
  payload.put<std::uint64_t>(ck.run_id);
  put_switches(payload, ck.switches);
  put_model(payload, ck.model);
  put_text<kWriterBytes>(payload, ck.writer);

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
  check_regular_file(path);
  const std::vector<std::uint8_t> bytes = read_file(path);
  const FileHeader header = check_header(
      path, std::span(bytes).first(std::min(bytes.size(), kHeaderBytes)), bytes.size());
  const std::span<const std::uint8_t> payload(bytes.data() + kHeaderBytes, header.payload_bytes);
  if (crc32c(payload) != header.crc)
    throw DataError("'" + path + "' is corrupt: payload CRC32C mismatch");

  ByteReader r(payload, path);
  const PayloadHead head = read_payload_head(r);
  check_workers(path, head, r.remaining());
  Checkpoint ck;
  ck.config_hash = head.config_hash;
  ck.step = head.step;
  ck.tokens_seen = head.tokens_seen;
  const std::uint64_t n = head.n;
  const std::uint32_t sites = head.sites;
  ck.sites.resize(sites);
  for (auto& w : ck.sites) {
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
  if (r.remaining() < header.trailer_bytes())
    throw DataError("'" + path + "' is inconsistent: no room for the writer's name");
  const std::uint64_t after_outer = check_outer_section(path, header, outer_n, r.remaining());
  ck.outer_ref.resize(outer_n);
  ck.outer_momentum.resize(outer_n);
  r.get_span<float>(ck.outer_ref, "outer_ref");
  r.get_span<float>(ck.outer_momentum, "outer_momentum");
  if (header.version >= 4) {
    const CodecHead codec =
        read_codec_head(r, path, n, sites, after_outer - kCodecHeadBytes - header.trailer_bytes());
    for (std::size_t k = 0; k < 3; ++k) {
      ck.codec_ref[k].resize(codec.ref_n[k]);
      r.get_span<float>(ck.codec_ref[k], "codec reference");
    }
    for (std::size_t k = 0; k < 3; ++k)
      for (auto& w : ck.sites) {
        w.codec_feedback[k].resize(codec.ef_n[k]);
        r.get_span<float>(w.codec_feedback[k], "codec feedback");
      }
  }
  if (header.run_id_bytes() > 0) ck.run_id = r.get<std::uint64_t>("run id");
  if (header.switch_bytes() > 0) ck.switches = get_switches(r, path);
  if (header.model_bytes() > 0) ck.model = get_model(r, path);
  if (header.trailer_bytes() > 0) {
    std::array<std::uint8_t, kWriterBytes> writer{};
    r.get_span<std::uint8_t>(writer, "writer");
    ck.writer = writer_from(writer);
  }
  if (ck.step < 0) throw DataError("'" + path + "' holds a negative step counter");
  return ck;
}

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / fmt::format("step_{:08d}.ckpt", step)).string();
}

std::optional<FoundCheckpoint> find_latest_checkpoint(const std::string& dir,
                                                      const std::string& writer) {
  for (const CheckpointInfo& info : scan_checkpoints(dir, writer).valid) {
    try {
      return FoundCheckpoint{info.path, load_checkpoint(info.path)};
    } catch (const DataError& e) {  // changed since the scan
      log::warn("skipping checkpoint {}: {}", info.path, e.message());
    }
  }
  return std::nullopt;
}

CheckpointInfo validate_checkpoint(const std::string& path) {
  check_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open '" + path + "': no such file or not readable");
  in.seekg(0, std::ios::end);
  const auto file_bytes = static_cast<std::uint64_t>(in.tellg());
  std::array<std::uint8_t, kHeaderBytes> header_bytes{};
  const auto header_span =
      std::span(header_bytes).first(std::min<std::uint64_t>(file_bytes, kHeaderBytes));
  read_at(in, path, 0, header_span);
  const FileHeader header = check_header(path, header_span, file_bytes);

  // The same order of checks as load_checkpoint: the CRC first, then the layout.
  std::vector<std::uint8_t> block(std::min<std::uint64_t>(header.payload_bytes, kStreamBlockBytes));
  std::uint32_t crc = 0;
  for (std::uint64_t at = 0; at < header.payload_bytes;) {
    const auto len = std::min<std::uint64_t>(block.size(), header.payload_bytes - at);
    const auto part = std::span(block).first(len);
    read_at(in, path, kHeaderBytes + at, part);
    crc = crc32c(part, crc);
    at += len;
  }
  if (crc != header.crc) throw DataError("'" + path + "' is corrupt: payload CRC32C mismatch");

  std::array<std::uint8_t, kPayloadHeadBytes> head_bytes{};
  const auto head_span =
      std::span(head_bytes).first(std::min<std::uint64_t>(header.payload_bytes, kPayloadHeadBytes));
  read_at(in, path, kHeaderBytes, head_span);
  ByteReader head_reader(head_span, path);
  const PayloadHead head = read_payload_head(head_reader);
  const std::uint64_t after_head = header.payload_bytes - kPayloadHeadBytes;
  const std::uint64_t per_worker = check_workers(path, head, after_head);
  for (std::uint32_t w = 0; w < head.sites; ++w) {
    std::array<std::uint8_t, 8> raw{};
    read_at(in, path, kHeaderBytes + kPayloadHeadBytes + w * per_worker, raw);
    std::int64_t optim_t = 0;
    std::memcpy(&optim_t, raw.data(), sizeof(optim_t));
    if (optim_t < 0) throw DataError("'" + path + "' holds a negative optimizer step counter");
  }
  const std::uint64_t outer_at = kPayloadHeadBytes + head.sites * per_worker;
  std::array<std::uint8_t, 8> outer_bytes{};
  const auto outer_span =
      std::span(outer_bytes).first(std::min<std::uint64_t>(header.payload_bytes - outer_at, 8));
  read_at(in, path, kHeaderBytes + outer_at, outer_span);
  ByteReader outer_reader(outer_span, path);
  const auto outer_n = outer_reader.get<std::uint64_t>("outer optimizer size");
  if (header.payload_bytes - outer_at - 8 < header.trailer_bytes())
    throw DataError("'" + path + "' is inconsistent: no room for the writer's name");
  const std::uint64_t after_outer =
      check_outer_section(path, header, outer_n, header.payload_bytes - outer_at - 8);
  if (header.version >= 4) {
    std::array<std::uint8_t, kCodecHeadBytes> codec_bytes{};
    read_at(in, path, kHeaderBytes + header.payload_bytes - after_outer, codec_bytes);
    ByteReader codec_reader(codec_bytes, path);
    read_codec_head(codec_reader, path, head.n, head.sites,
                    after_outer - kCodecHeadBytes - header.trailer_bytes());
  }
  if (head.step < 0) throw DataError("'" + path + "' holds a negative step counter");
  std::string writer;
  std::optional<CheckpointModel> model;
  if (header.trailer_bytes() > 0) {
    std::array<std::uint8_t, kWriterBytes> field{};
    read_at(in, path, kHeaderBytes + header.payload_bytes - kWriterBytes, field);
    writer = writer_from(field);
  }
  if (header.model_bytes() > 0) {
    std::array<std::uint8_t, kModelBytes> field{};
    read_at(in, path, kHeaderBytes + header.payload_bytes - kWriterBytes - kModelBytes, field);
    ByteReader model_reader(field, path);
    model = get_model(model_reader, path);
  }
  if (header.switch_bytes() > 0) {
    std::vector<std::uint8_t> field(kSwitchBytes);
    read_at(in, path,
            kHeaderBytes + header.payload_bytes - kWriterBytes - kModelBytes - kSwitchBytes, field);
    ByteReader switch_reader(field, path);
    get_switches(switch_reader, path);
  }
  std::uint64_t run_id = 0;
  if (header.run_id_bytes() > 0) {
    std::array<std::uint8_t, kRunIdBytes> field{};
    read_at(in, path,
            kHeaderBytes + header.payload_bytes - kWriterBytes - kModelBytes - kSwitchBytes -
                kRunIdBytes,
            field);
    ByteReader run_reader(field, path);
    run_id = run_reader.get<std::uint64_t>("run id");
  }
  return {head.step, head.config_hash, file_bytes, path, writer, model, run_id};
}

CheckpointScan scan_checkpoints(const std::string& dir, const std::string& writer,
                                std::uint64_t config_hash) {
  CheckpointScan scan;
  for (const auto& [step, path] : checkpoint_files(dir)) {
    bool foreign = false;
    try {
      CheckpointInfo info = validate_checkpoint(path);
      if (info.step != step)
        throw DataError(
            fmt::format("'{}' holds step {} but is named for step {}", path, info.step, step));
      if (!writer.empty() && !info.writer.empty() && info.writer != writer)
        throw DataError(fmt::format(
            "'{}' was written by {}, not by {}: a checkpoint copied from another rank's "
            "directory cannot resume this one",
            path, info.writer, writer));
      if (config_hash != 0 && info.config_hash != config_hash) {
        foreign = true;
        throw DataError(
            fmt::format("'{}' belongs to another config (config hash {:016x}, this job's {:016x})",
                        path, info.config_hash, config_hash));
      }
      scan.valid.push_back(std::move(info));
    } catch (const DataError& e) {
      log::warn("skipping checkpoint {}: {}", path, e.message());
      scan.rejected.push_back({step, path, e.message(), foreign});
    }
  }
  return scan;
}

std::vector<CheckpointInfo> list_valid_checkpoints(const std::string& dir) {
  return scan_checkpoints(dir, "").valid;
}

}  // namespace desloc::train
