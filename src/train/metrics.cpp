// JSONL metrics writer.
#include "train/metrics.hpp"

#include <filesystem>
#include <fstream>
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
}  // namespace

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
  write_file_atomic(path_,
                    std::span(reinterpret_cast<const std::uint8_t*>(kept.data()), kept.size()));
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
