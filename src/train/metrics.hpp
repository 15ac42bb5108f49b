// JSONL metrics: one JSON object per line, flushed per record so a crash loses nothing
// already reported.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "desloc/train/metrics_records.hpp"

namespace desloc::train {

// The run id of the first run record in the metrics file at `path` that has one: the run whose
// history the file holds. 0 when there is none (no file, or one written before run ids).
std::uint64_t recorded_run_id(const std::string& path);

class MetricsWriter {
 public:
  // On resume, records beyond resume_step (written after the checkpoint by a run that later
  // died) are dropped so the file describes exactly one trajectory.
  MetricsWriter(const std::string& path, bool resume, std::int64_t resume_step);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write_line(const std::string& json_object);
  template <class Record>
  void write(const Record& r) {
    write_line(r.to_json());
  }
  // A rollback to `step` (elastic recovery): drops the records after it, which are replayed.
  void rewind(std::int64_t step);

 private:
  void drop_after(std::int64_t step);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace desloc::train
