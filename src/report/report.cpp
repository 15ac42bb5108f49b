// `desloc report`: metrics.jsonl -> RunSeries -> summary table and SVG charts -> one HTML page.
// The page is self-contained (inline CSS and SVG, no scripts or links) so it can be mailed or
// archived next to the runs and still open years later.
#include "desloc/report/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <span>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/report/svg_chart.hpp"
#include "report/jsonl.hpp"
#include "report/records.hpp"

namespace desloc::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// The val-loss target is the worst run's final val loss times this factor (1.0: every run that
// was evaluated reaches it, so "bytes to target" is defined for all of them).
constexpr double kTargetFactor = 1.0;
// Longer train curves are averaged over equal windows down to about this many points: the
// chart stays small and per-step noise does not hide the trend.
constexpr std::size_t kMaxTrainPoints = 800;
std::string default_name(const std::string& path) {
  const std::filesystem::path p = std::filesystem::absolute(path).lexically_normal();
  const std::string dir = p.parent_path().filename().string();
  return dir.empty() ? p.stem().string() : dir;
}

bool finite(double v) { return std::isfinite(v); }

std::string fmt_loss(double v) { return finite(v) ? fmt::format("{:.4f}", v) : "\u2014"; }

// Bytes in binary units; the exact count goes in a tooltip.
std::string fmt_bytes(double b) {
  if (!finite(b)) return "\u2014";
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = b;
  while (std::abs(v) >= 1024.0 && u < 5) v /= 1024.0, ++u;
  const std::string shown =
      u == 0 ? fmt::format("{:.0f} B", v) : fmt::format("{:.2f} {}", v, kUnits[u]);
  return fmt::format(R"(<span title="{:.0f} bytes">{}</span>)", b, shown);
}

std::string fmt_seconds(double v) { return finite(v) ? fmt::format("{:.1f} s", v) : "\u2014"; }

std::string fmt_rate(double v) {
  if (!finite(v)) return "\u2014";
  if (v >= 1e6) return fmt::format("{:.2f} M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:.1f} k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

// Train points averaged over windows of `window` steps (1: unchanged); x = mean step or bytes.
struct Curve {
  std::vector<double> step, loss, bytes;
};
Curve train_curve(const std::vector<TrainPoint>& train, std::size_t& window) {
  const auto n = train.size();
  window = std::max<std::size_t>(1, (n + kMaxTrainPoints - 1) / kMaxTrainPoints);
  Curve c;
  for (std::size_t i = 0; i < n; i += window) {
    const std::size_t end = std::min(n, i + window);
    double s = 0, l = 0, b = 0;
    for (std::size_t j = i; j < end; ++j) {
      s += double(train[j].step);
      l += train[j].loss;  // a NaN loss makes the window NaN, and the chart skips it
      b += train[j].bytes_sent;
    }
    const double k = double(end - i);
    c.step.push_back(s / k);
    c.loss.push_back(l / k);
    c.bytes.push_back(b / k);
  }
  return c;
}

const char* kCss = R"css(
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
p.note { color: #555; font-size: 13px; max-width: 1100px; line-height: 1.45; }
table { border-collapse: collapse; font-size: 13px; margin: 12px 0 20px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 5px 9px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; border-bottom: 2px solid #bbb; }
td.name, th.name, td.text { text-align: left; }
td.text { white-space: nowrap; }
td.name { overflow-wrap: anywhere; min-width: 11em; }
td.path { text-align: left; font-family: monospace; font-size: 11px; color: #666;
          word-break: break-all; max-width: 280px; }
span.swatch { display: inline-block; width: 14px; height: 4px; margin: 0 6px 3px 0; }
span.sub { display: block; color: #777; font-size: 11px; white-space: nowrap; }
span.none { color: #999; font-style: italic; }
div.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; border: 1px solid #e4e4e4; padding: 6px; }
figure svg { max-width: 100%; height: auto; display: block; }
figcaption { font-size: 12px; color: #555; max-width: 700px; padding: 4px 6px; }
)css";

}  // namespace

RunSeries load_run(const std::string& jsonl_path) {
  RunSeries run;
  run.path = jsonl_path;
  std::vector<std::string> replans;  // "kx after step", in the order they happened
  for (const JsonLine& line : read_jsonl(jsonl_path)) {
    const std::string where = fmt::format("{}:{}", jsonl_path, line.line);
    const JsonValue& r = line.value;
    if (!r.is_object())
      throw DataError(
          fmt::format("{}: expected a JSON object per line; was the file written by "
                      "`desloc train`?",
                      where));
    const std::string type = r.string_or("type", "");
    if (type == "run") {
      const train::RunRecord h = read_run_record(r);
      if (!h.name.empty()) run.name = h.name;
      run.method = h.method;
      std::string settings;
      auto add = [&](const char* key, const std::string& text) {
        settings += fmt::format("{}{}={}", settings.empty() ? "" : " ", key, text);
      };
      if (h.workers > 0) add("workers", std::to_string(h.workers));
      for (const auto& [key, k] :
           {std::pair{"kx", h.kx}, std::pair{"ku", h.ku}, std::pair{"kv", h.kv}})
        if (k) add(key, std::to_string(*k));
      if (!h.outer.empty() && h.outer != "none") add("outer", h.outer);
      run.settings = settings;
    } else if (type == "train") {
      const train::TrainRecord t = read_train_record(r, where);
      TrainPoint p;
      p.step = t.step;
      p.loss = t.loss;
      p.tokens_per_s = t.tokens_per_s;
      p.step_ms = std::isfinite(t.step_ms) && t.step_ms > 0.0 ? t.step_ms : 0.0;
      for (std::size_t k = 0; k < p.bytes_by_state.size(); ++k)
        p.bytes_by_state[k] = static_cast<double>(t.wire[k]);
      // The total as written: older files have it without the split by state.
      const double bytes = r.number_or_nan("bytes_sent");
      p.bytes_sent = std::isfinite(bytes) ? bytes : 0.0;  // no accounting = no traffic
      run.train.push_back(p);
    } else if (type == "eval") {
      const train::EvalRecord e = read_eval_record(r, where);
      run.eval.push_back({e.step, e.val_loss, 0.0, 0.0, e.val_bpb});
    } else if (type == "replan") {  // sync.replan: the periods a run switched to
      replans.push_back(fmt::format("{} after {}", r.number_or_nan("kx"), r.number_or_nan("step")));
    }  // other record types are for other tools
  }
  if (!replans.empty())
    run.settings += fmt::format("{}re-planned kx to {}", run.settings.empty() ? "" : " ",
                                fmt::join(replans, ", "));
  if (run.name.empty()) run.name = default_name(jsonl_path);

  // Bytes and training time at each eval: from the train records at or before its step (an
  // eval at step N is written after train step N).
  auto by_step = [](const auto& a, const auto& b) { return a.step < b.step; };
  std::stable_sort(run.train.begin(), run.train.end(), by_step);
  std::stable_sort(run.eval.begin(), run.eval.end(), by_step);
  const bool timed = std::any_of(run.train.begin(), run.train.end(),
                                 [](const TrainPoint& p) { return p.step_ms > 0.0; });
  std::size_t t = 0;
  double elapsed_ms = 0.0;
  for (EvalPoint& e : run.eval) {
    for (; t < run.train.size() && run.train[t].step <= e.step; ++t)
      elapsed_ms += run.train[t].step_ms;
    e.bytes_sent = t == 0 ? 0.0 : run.train[t - 1].bytes_sent;
    e.elapsed_s = timed ? elapsed_ms / 1e3 : kNaN;
  }
  return run;
}

double common_val_target(const std::vector<RunSeries>& runs) {
  double worst = kNaN;
  for (const RunSeries& r : runs) {
    if (r.eval.empty() || !finite(r.eval.back().val_loss)) continue;
    if (!finite(worst) || r.eval.back().val_loss > worst) worst = r.eval.back().val_loss;
  }
  return worst * kTargetFactor;
}

RunSummary summarize(const RunSeries& run, double val_target) {
  RunSummary s;
  s.final_train_loss = run.train.empty() ? kNaN : run.train.back().loss;
  s.steps = run.train.empty() ? 0 : run.train.back().step;
  if (!run.eval.empty()) s.steps = std::max(s.steps, run.eval.back().step);
  s.final_val_loss = run.eval.empty() ? kNaN : run.eval.back().val_loss;
  s.final_val_bpb = run.eval.empty() ? kNaN : run.eval.back().val_bpb;
  s.best_val_loss = kNaN;
  s.bytes_to_target = kNaN;
  s.seconds_to_target = kNaN;
  for (const EvalPoint& e : run.eval) {
    if (!finite(e.val_loss)) continue;
    if (!finite(s.best_val_loss) || e.val_loss < s.best_val_loss) s.best_val_loss = e.val_loss;
    if (s.step_to_target < 0 && finite(val_target) && e.val_loss <= val_target) {
      s.step_to_target = e.step;
      s.bytes_to_target = e.bytes_sent;
      s.seconds_to_target = e.elapsed_s;
    }
  }
  double total_ms = 0.0;
  for (const TrainPoint& p : run.train) total_ms += p.step_ms;
  s.total_seconds = total_ms > 0.0 ? total_ms / 1e3 : kNaN;
  s.total_bytes = run.train.empty() ? 0.0 : run.train.back().bytes_sent;
  if (!run.train.empty()) s.bytes_by_state = run.train.back().bytes_by_state;
  double sum = 0.0;
  std::size_t n = 0;
  for (const TrainPoint& p : run.train)
    if (finite(p.tokens_per_s)) sum += p.tokens_per_s, ++n;
  s.mean_tokens_per_s = n > 0 ? sum / double(n) : kNaN;
  return s;
}

namespace {

// Legend labels must tell runs apart even when two share a name.
std::vector<std::string> run_labels(const std::vector<RunSeries>& runs) {
  std::vector<std::string> labels;
  std::map<std::string, int> seen;
  for (const RunSeries& r : runs) {
    const int k = ++seen[r.name];
    labels.push_back(k == 1 ? r.name : fmt::format("{} ({})", r.name, k));
  }
  return labels;
}

// One run's row of the summary table, as its cells read it.
struct Row {
  std::size_t index;
  const RunSeries& run;
  const RunSummary& sum;
  const std::string& label;
  double most_bytes;  // of every run
};

std::string bytes_cell(const Row& r) {
  if (r.sum.total_bytes <= 0.0) return "<span class=\"none\">no communication</span>";
  std::string bytes = fmt_bytes(r.sum.total_bytes);
  for (std::size_t k = 0; k < r.sum.bytes_by_state.size(); ++k)  // one line per state kind
    if (r.sum.bytes_by_state[k] > 0.0)
      bytes += fmt::format("<span class=\"sub\">{} {}</span>", kStateNames[k],
                           fmt_bytes(r.sum.bytes_by_state[k]));
  return bytes;
}

std::string share_cell(const Row& r) {
  if (r.sum.total_bytes <= 0.0) return "0";
  return r.sum.total_bytes >= r.most_bytes
             ? "1 (most)"
             : fmt::format("1/{:.0f}", r.most_bytes / r.sum.total_bytes);
}

// The summary table's columns: header, the cells' class ("" for numbers) and the cell.
struct Column {
  const char* header;
  const char* css;
  std::string (*cell)(const Row&);
};

const std::array<Column, 16> kColumns{{
    {"run", "name",
     [](const Row& r) {
       return fmt::format("<span class=\"swatch\" style=\"background:{}\"></span>{}",
                          series_colour(r.index), xml_escape(r.label));
     }},
    {"method", "text",
     [](const Row& r) {
       return r.run.method.empty() ? std::string("\u2014") : xml_escape(r.run.method);
     }},
    {"settings", "text",
     [](const Row& r) {
       return r.run.settings.empty() ? std::string("\u2014") : xml_escape(r.run.settings);
     }},
    {"steps", "", [](const Row& r) { return fmt::format("{}", r.sum.steps); }},
    {"final train loss", "", [](const Row& r) { return fmt_loss(r.sum.final_train_loss); }},
    {"final val loss", "", [](const Row& r) { return fmt_loss(r.sum.final_val_loss); }},
    {"final val bits/byte", "", [](const Row& r) { return fmt_loss(r.sum.final_val_bpb); }},
    {"best val loss", "", [](const Row& r) { return fmt_loss(r.sum.best_val_loss); }},
    {"bytes / worker", "", bytes_cell},
    {"share of most", "", share_cell},
    {"bytes / worker to target", "",
     [](const Row& r) {
       return r.sum.step_to_target < 0 ? std::string("\u2014") : fmt_bytes(r.sum.bytes_to_target);
     }},
    {"step at target", "",
     [](const Row& r) {
       return r.sum.step_to_target < 0 ? std::string("\u2014")
                                       : fmt::format("{}", r.sum.step_to_target);
     }},
    {"step time to target", "", [](const Row& r) { return fmt_seconds(r.sum.seconds_to_target); }},
    {"step time", "", [](const Row& r) { return fmt_seconds(r.sum.total_seconds); }},
    {"mean tokens/s", "", [](const Row& r) { return fmt_rate(r.sum.mean_tokens_per_s); }},
    {"metrics file", "path", [](const Row& r) { return xml_escape(r.run.path); }},
}};

std::string summary_table(const std::vector<RunSeries>& runs, const std::vector<RunSummary>& sums,
                          const std::vector<std::string>& labels) {
  double most_bytes = 0.0;
  for (const RunSummary& s : sums) most_bytes = std::max(most_bytes, s.total_bytes);
  std::string h = "<table>\n<tr>";
  // Text columns' headers align left with them (class "name"); numbers' align right.
  for (const Column& c : kColumns)
    h += *c.css != '\0' ? fmt::format("<th class=\"name\">{}</th>", c.header)
                        : fmt::format("<th>{}</th>", c.header);
  h += "</tr>\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Row row{i, runs[i], sums[i], labels[i], most_bytes};
    h += "<tr>";
    for (const Column& c : kColumns)
      h += *c.css != '\0' ? fmt::format("<td class=\"{}\">{}</td>", c.css, c.cell(row))
                          : fmt::format("<td>{}</td>", c.cell(row));
    h += "</tr>\n";
  }
  return h + "</table>\n";
}

// The charts: one series per run in every chart, so a run keeps its colour throughout.
std::string charts(const std::vector<RunSeries>& runs, const std::vector<RunSummary>& sums,
                   const std::vector<std::string>& labels) {
  std::vector<Series> train_step, val_step, val_time, val_bytes, train_bytes;
  std::size_t max_window = 1;
  bool any_silent = false;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunSeries& r = runs[i];
    std::size_t window = 1;
    const Curve c = train_curve(r.train, window);
    max_window = std::max(max_window, window);
    train_step.push_back({labels[i], c.step, c.loss});
    Series v{labels[i], {}, {}};
    for (const EvalPoint& e : r.eval) v.x.push_back(double(e.step)), v.y.push_back(e.val_loss);
    val_step.push_back(v);
    Series vt{labels[i], {}, {}};
    for (const EvalPoint& e : r.eval)
      if (finite(e.elapsed_s)) vt.x.push_back(e.elapsed_s), vt.y.push_back(e.val_loss);
    val_time.push_back(vt);
    if (sums[i].total_bytes <= 0.0) {
      any_silent = true;
      const std::string silent = labels[i] + " (no communication)";
      val_bytes.push_back({silent, {}, {}});
      train_bytes.push_back({silent, {}, {}});
      continue;
    }
    Series vb{labels[i], {}, {}};
    for (const EvalPoint& e : r.eval) vb.x.push_back(e.bytes_sent), vb.y.push_back(e.val_loss);
    val_bytes.push_back(vb);
    // Steps before the first sync sent nothing; averaging them into a window would invent a
    // point between 0 and the first sync's bytes on the log axis.
    std::vector<TrainPoint> sent;
    std::copy_if(r.train.begin(), r.train.end(), std::back_inserter(sent),
                 [](const TrainPoint& p) { return p.bytes_sent > 0.0; });
    std::size_t sent_window = 1;
    const Curve cb = train_curve(sent, sent_window);
    train_bytes.push_back({labels[i], cb.bytes, cb.loss});
  }
  const std::string smoothing =
      max_window > 1
          ? fmt::format(" Train loss is averaged over windows of up to {} steps.", max_window)
          : std::string();
  const std::string silent_note =
      any_silent ? " Runs that sent no bytes cannot appear on a log axis; they are listed in the "
                   "legend only."
                 : "";
  std::string h = "<div class=\"charts\">\n";
  auto figure = [&](const std::vector<Series>& s, const ChartOptions& o, const std::string& cap) {
    // Inline SVG in HTML needs no namespace declaration; dropping it leaves the page without a
    // single URL, which makes "self-contained" easy to check.
    std::string svg = svg_line_chart(s, o);
    const std::string xmlns = " xmlns=\"http://www.w3.org/2000/svg\"";
    if (const auto at = svg.find(xmlns); at != std::string::npos) svg.erase(at, xmlns.size());
    h += "<figure>\n" + svg;
    h += fmt::format("<figcaption>{}</figcaption>\n</figure>\n", cap);
  };
  figure(train_step, {"Train loss vs step", "step", "train loss (nats)"},
         "Training loss of each run (mean over its workers)." + smoothing);
  figure(val_step, {"Validation loss vs step", "step", "validation loss (nats)"},
         "Validation loss of the workers' mean parameters at each evaluation.");
  figure(val_time, {"Validation loss vs training time", "step time (s)", "validation loss (nats)"},
         "Validation loss against the run's summed step times (evaluation excluded): the "
         "comparison at equal wall-clock time. Runs whose files record no step times have no "
         "line.");
  figure(val_bytes,
         {"Validation loss vs bytes communicated", "bytes sent per worker (log)",
          "validation loss (nats)", true},
         "Validation loss against cumulative wire bytes per worker: further left is cheaper "
         "for the same loss." +
             silent_note);
  figure(train_bytes,
         {"Train loss vs bytes communicated", "bytes sent per worker (log)", "train loss (nats)",
          true},
         "Training loss against cumulative wire bytes per worker." + smoothing + silent_note);
  return h + "</div>\n";
}

}  // namespace

std::string render_report_html(const std::vector<RunSeries>& runs, const std::string& title) {
  const double target = common_val_target(runs);
  std::vector<RunSummary> sums;
  for (const RunSeries& r : runs) sums.push_back(summarize(r, target));
  const std::vector<std::string> labels = run_labels(runs);
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += fmt::format("<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n", xml_escape(title),
                   kCss);
  h += fmt::format("<h1>{}</h1>\n", xml_escape(title));
  if (runs.empty()) {
    h += "<p class=\"note\">No runs were given.</p>\n</body>\n</html>\n";
    return h;
  }
  h += fmt::format(
      "<p class=\"note\">{} run{}. Bytes are wire bytes sent per worker (a ring all-reduce sends "
      "2(M&minus;1)/M of the payload). The target validation loss is {}: the worst final "
      "validation loss among the runs, so every evaluated run reaches it; \"to target\" is the "
      "first evaluation at or below it. Step time is the sum of the steps' wall times, "
      "evaluation excluded.</p>\n",
      runs.size(), runs.size() == 1 ? "" : "s", fmt_loss(target));
  h += summary_table(runs, sums, labels);
  h += charts(runs, sums, labels);
  h += "</body>\n</html>\n";
  return h;
}

void write_report(const std::vector<std::string>& jsonl_paths, const std::string& out_html,
                  const std::string& title) {
  std::vector<RunSeries> runs;
  runs.reserve(jsonl_paths.size());
  for (const std::string& p : jsonl_paths) runs.push_back(load_run(p));
  const std::string html = render_report_html(runs, title);
  write_file_atomic(out_html, html);
}

}  // namespace desloc::report
