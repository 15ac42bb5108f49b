// JSONL metrics writer.
#include "train/metrics.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/log.hpp"

namespace desloc::train {
namespace {
// The "step" field of a record this trainer wrote, or -1 (run headers have none).
std::int64_t step_of(const std::string& line) {
  const auto at = line.find("\"step\":");
  if (at == std::string::npos) return -1;
  std::int64_t v = 0;
  bool any = false;
  for (std::size_t i = at + 7; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i) {
    v = v * 10 + (line[i] - '0');
    any = true;
  }
  return any ? v : -1;
}
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.7g}", v);
}

std::string json_exact(float v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.9g}", v);  // round-trips a float
}

// A JSON string literal (quotes included) for free text such as a reason.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string period(const std::optional<std::int64_t>& k) { return k ? std::to_string(*k) : "null"; }
}  // namespace

std::string RunRecord::to_json() const {
  return fmt::format(
      R"({{"type":"run","name":{},"method":"{}","workers":{},"kx":{},"ku":{},"kv":{},"outer":"{}",)"
      R"("parameters":{},"batch":{},"seq_len":{},"steps":{},"config_hash":"{:016x}",)"
      R"("run_id":"{:016x}","sites":"{}","ranks_per_site":{},"rank":"{}","wan_link":"{}"}})",
      json_string(name), method, workers, period(kx), period(ku), period(kv), outer, parameters,
      batch, seq_len, steps, config_hash, run_id, sites, ranks_per_site, rank, wan_link);
}

std::string TrainRecord::to_json() const {
  std::string by_worker, by_site;
  for (std::size_t i = 0; i < wire_by_worker.size(); ++i)
    by_worker += fmt::format("{}{}", i ? "," : "", wire_by_worker[i]);
  for (std::size_t i = 0; i < loss_by_site.size(); ++i)
    by_site += fmt::format("{}{}", i ? "," : "", json_exact(loss_by_site[i]));
  std::string waits;
  for (std::size_t i = 0; i < wait_ms_by_site.size(); ++i)
    waits += fmt::format("{}{}", i ? "," : "", json_number(wait_ms_by_site[i]));
  return fmt::format(
      R"({{"type":"train","step":{},"loss":{},"lr":{},"grad_norm":{},"tokens_per_s":{},"step_ms":{},)"
      R"("sync_ms":{},"cpu_ms":{},"comm_cpu_ms":{},"wire_ms":{},"control_ms":{},"tokens":{},"workers":{},"synced":"{}",)"
      R"("bytes_sent":{},)"
      R"("bytes_by_state":{{"grad":{},"x":{},"u":{},"v":{}}},)"
      R"("payload_by_state":{{"grad":{},"x":{},"u":{},"v":{}}},"bytes_sent_by_worker":[{}],)"
      R"("loss_by_site":[{}],"wait_ms_by_site":[{}],"site_bytes_sent":{},"region_bytes_sent":{}}})",
      step, json_number(loss), json_number(lr), json_number(grad_norm), json_number(tokens_per_s),
      json_number(step_ms), json_number(sync_ms), json_number(cpu_ms), json_number(comm_cpu_ms),
      json_number(wire_ms), json_number(control_ms), tokens, workers, synced,
      wire[0] + wire[1] + wire[2] + wire[3], wire[0], wire[1], wire[2], wire[3], payload[0],
      payload[1], payload[2], payload[3], by_worker, by_site, waits, site_bytes_sent,
      region_bytes_sent);
}

std::string EvalRecord::to_json() const {
  return fmt::format(
      R"({{"type":"eval","step":{},"val_loss":{},"val_bpb":{},"eval_s":{},"workers":{}}})", step,
      json_number(val_loss), json_number(val_bpb), json_number(eval_s), workers);
}

std::string RecoveryRecord::to_json() const {
  return fmt::format(R"({{"type":"recovery","step":{},"failed_step":{},"epoch":{},"sites":{},)"
                     R"("replayed_steps":{},"recover_s":{},"bytes_resent":{}}})",
                     step, failed_step, epoch, sites, replayed_steps, json_number(recover_s),
                     bytes_resent);
}

std::string RejoinRecord::to_json() const {
  return fmt::format(
      R"({{"type":"rejoin","step":{},"epoch":{},"sites":{},"state_bytes":{},"transfer_s":{}}})",
      step, epoch, sites, state_bytes, json_number(transfer_s));
}

std::string ReplanRecord::to_json() const {
  return fmt::format(
      R"({{"type":"replan","step":{},"kx":{},"ku":{},"kv":{},"old_kx":{},"state_s":{},"compute_s":{},)"
      R"("reference_s":{},"bytes_per_s":{},"overhead":{},"target":{},"predicted_step_s":{},)"
      R"("reason":{}}})",
      step, kx, ku, kv, old_kx, json_number(state_s), json_number(compute_s),
      json_number(reference_s), json_number(bytes_per_s), json_number(overhead),
      json_number(target), json_number(predicted_step_s), json_string(reason));
}

std::string RejectionRecord::to_json() const {
  return fmt::format(R"({{"type":"rejection","step":{},"state":"{}","site":{},"reason":{}}})", step,
                     state, json_string(site), json_string(reason));
}

std::string JoinRecord::to_json() const {
  return fmt::format(R"({{"type":"join","step":{},"workers_before":{},"workers_after":{}}})", step,
                     workers_before, workers_after);
}

std::uint64_t recorded_run_id(const std::string& path) {
  std::ifstream in(path);
  constexpr std::string_view kField = "\"run_id\":\"";
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"type\":\"run\"") == std::string::npos) continue;
    const auto at = line.find(kField);
    if (at == std::string::npos) continue;
    const std::uint64_t id = std::strtoull(line.c_str() + at + kField.size(), nullptr, 16);
    if (id != 0) return id;
  }
  return 0;
}

MetricsWriter::MetricsWriter(const std::string& path, bool resume, std::int64_t resume_step)
    : path_(path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  if (resume && std::filesystem::exists(path)) drop_after(resume_step);
  file_ = std::fopen(path.c_str(), resume ? "a" : "w");
  if (file_ == nullptr) throw_errno("cannot open metrics file", path);
}

void MetricsWriter::drop_after(std::int64_t step) {
  std::ifstream in(path_);
  std::string line, kept;
  std::size_t dropped = 0;
  while (std::getline(in, line)) {
    if (step_of(line) > step) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  write_file_atomic(path_, kept);
  if (dropped > 0)
    log::info("metrics: dropped {} records after step {} from {}", dropped, step, path_);
}

void MetricsWriter::rewind(std::int64_t step) {
  if (file_ != nullptr && std::fclose(file_) != 0) throw_errno("cannot close metrics file", path_);
  file_ = nullptr;
  drop_after(step);
  file_ = std::fopen(path_.c_str(), "a");
  if (file_ == nullptr) throw_errno("cannot reopen metrics file", path_);
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr && std::fclose(file_) != 0)
    log::warn("closing metrics file {} failed", path_);
}

void MetricsWriter::write_line(const std::string& json_object) {
  if (std::fputs(json_object.c_str(), file_) < 0 || std::fputc('\n', file_) < 0 ||
      std::fflush(file_) != 0)
    throw_errno("cannot write metrics to", path_);
}

}  // namespace desloc::train
