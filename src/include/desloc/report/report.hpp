// `desloc report`: loads training runs from their JSONL metrics and renders one self-contained
// HTML page (inline CSS and SVG, no scripts, no network) that compares them side by side.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace desloc::report {

// The state kinds of "bytes_by_state", in the order the arrays below use.
inline constexpr const char* kStateNames[4] = {"grad", "x", "u", "v"};

// One {"type":"train"} record. Non-finite values (null in the file) are NaN.
struct TrainPoint {
  std::int64_t step = 0;
  double loss = 0.0;
  double tokens_per_s = 0.0;
  double bytes_sent = 0.0;  // cumulative wire bytes per worker up to and including this step
  std::array<double, 4> bytes_by_state{};  // the same, split by state kind (kStateNames order)
  double step_ms = 0.0;                    // the step's wall time (0 where the file has none)
};

// One {"type":"eval"} record, with the bytes sent by the time it was taken.
struct EvalPoint {
  std::int64_t step = 0;
  double val_loss = 0.0;
  double bytes_sent = 0.0;  // from the last train record at or before `step`
  // Training time up to `step`: the sum of the step times of the train records at or before it
  // (evaluation excluded). NaN when the file records no step times.
  double elapsed_s = 0.0;
  double val_bpb = 0.0;  // bits per byte; NaN in files written before it was recorded
};

// A run as read from its metrics file.
struct RunSeries {
  std::string name;      // "name" of the {"type":"run"} header, else the file's directory name
  std::string method;    // "method" of the header, or empty
  std::string settings;  // e.g. "workers=4 kx=32 ku=96 kv=192" from the header, or empty
  std::string path;      // the metrics file it came from
  std::vector<TrainPoint> train;
  std::vector<EvalPoint> eval;
};

// Reads a metrics.jsonl file. Unknown record types and fields are ignored; a line that is not
// valid JSON, or a train/eval record without a numeric "step", is a DataError naming file:line.
RunSeries load_run(const std::string& jsonl_path);

// The figures in a run's table row. NaN / -1 mean "not available".
struct RunSummary {
  std::int64_t steps = 0;  // last train step
  double final_train_loss = 0.0;
  double final_val_loss = 0.0;
  double final_val_bpb = 0.0;  // bits per byte at the last evaluation
  double best_val_loss = 0.0;
  double total_bytes = 0.0;                // per worker
  double bytes_to_target = 0.0;            // per worker, at the first eval with val_loss <= target
  std::int64_t step_to_target = -1;        // step of that eval
  double seconds_to_target = 0.0;          // its elapsed_s (NaN without step times)
  double total_seconds = 0.0;              // the sum of every step time (NaN without them)
  double mean_tokens_per_s = 0.0;          // arithmetic mean over train records
  std::array<double, 4> bytes_by_state{};  // per worker, by state kind: kStateNames order
};

// The common target validation loss: the worst (largest) final validation loss over the runs
// that have one, so every run reaches it. NaN if no run was evaluated.
double common_val_target(const std::vector<RunSeries>& runs);

RunSummary summarize(const RunSeries& run, double val_target);

// The HTML page for the runs, in the order given (which fixes their chart colours).
std::string render_report_html(const std::vector<RunSeries>& runs, const std::string& title);

// load_run for every path, render_report_html, and an atomic write of out_html.
void write_report(const std::vector<std::string>& jsonl_paths, const std::string& out_html,
                  const std::string& title);

}  // namespace desloc::report
