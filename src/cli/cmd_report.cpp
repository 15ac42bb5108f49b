// `desloc report RUNS... --out report.html`: compares training runs in one self-contained HTML
// page. A RUN is a metrics.jsonl, a run directory holding one, or a directory of run directories.
#include "commands.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/report/report.hpp"

namespace desloc::cli {
namespace {

constexpr const char* kMetricsFile = "metrics.jsonl";

struct ReportOptions {
  std::vector<std::string> runs;
  std::string out = "report.html";
  std::string title = "desloc training runs";
};

// One argument -> the metrics files it names, in a stable order.
std::vector<std::string> metrics_files(const std::string& arg) {
  namespace fs = std::filesystem;
  const fs::path p(arg);
  if (!fs::exists(p))
    throw ConfigError(
        fmt::format("report: {} does not exist; pass a metrics.jsonl or the run's "
                    "out_dir (train.out_dir of its config)",
                    arg));
  if (!fs::is_directory(p)) return {arg};
  if (fs::is_regular_file(p / kMetricsFile)) return {(p / kMetricsFile).string()};
  std::vector<std::string> found;  // a directory of runs, e.g. a bench output folder
  for (const auto& entry : fs::directory_iterator(p))
    if (entry.is_directory() && fs::is_regular_file(entry.path() / kMetricsFile))
      found.push_back((entry.path() / kMetricsFile).string());
  if (found.empty())
    throw ConfigError(
        fmt::format("report: directory {} holds no {} (nor do its subdirectories); "
                    "pass a run's out_dir or its metrics file",
                    arg, kMetricsFile));
  std::sort(found.begin(), found.end());
  return found;
}

int run_report(const ReportOptions& o) {
  std::vector<std::string> files;
  for (const std::string& arg : o.runs)
    for (std::string& f : metrics_files(arg)) files.push_back(std::move(f));
  report::write_report(files, o.out, o.title);
  std::printf("wrote %s (%zu run%s)\n", o.out.c_str(), files.size(), files.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace

Command add_report(CLI::App& app) {
  auto opts = std::make_shared<ReportOptions>();
  ReportOptions& o = *opts;
  auto* cmd = app.add_subcommand(
      "report", "compare training runs in one self-contained HTML page (tables and SVG charts)");
  cmd->add_option("runs", o.runs,
                  "metrics.jsonl files, run directories holding one, or directories of runs")
      ->required();
  cmd->add_option("-o,--out", o.out, "the HTML file to write")->capture_default_str();
  cmd->add_option("--title", o.title, "the page title")->capture_default_str();
  return {cmd, [opts] { return run_report(*opts); }};
}

}  // namespace desloc::cli
