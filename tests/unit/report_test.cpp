// `desloc report` pieces: the JSONL parser, the SVG chart, and the HTML report computed from
// synthetic metrics whose table values have a closed form.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>

#include "desloc/core/error.hpp"
#include "desloc/report/report.hpp"
#include "desloc/report/svg_chart.hpp"
#include "desloc/report/topology_svg.hpp"
#include "desloc/topology/topology.hpp"
#include "report/jsonl.hpp"
#include "report/records.hpp"

using namespace desloc;
using namespace desloc::report;
namespace fs = std::filesystem;

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The coordinate pairs of every polyline, in order.
std::vector<std::size_t> polyline_sizes(const std::string& svg) {
  std::vector<std::size_t> sizes;
  static const std::regex kPoints(R"re(<polyline[^>]* points="([^"]*)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), kPoints);
       it != std::sregex_iterator(); ++it) {
    const std::string pts = (*it)[1].str();
    sizes.push_back(pts.empty() ? 0 : count(pts, ",") /* one comma per x,y pair */);
  }
  return sizes;
}

class ReportFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("desloc_report_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& rel, const std::string& text) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  fs::path dir_;
};

// Run A (desloc): 10 steps, loss 10 - 0.5 t, tokens/s 1000 + 100 t (mean 1550), 1000 bytes per
// step (total 10000); val losses 7.0 6.5 6.0 5.5 5.2 at steps 2..10.
std::string run_a() {
  std::string s =
      R"({"type":"run","name":"desloc-kx32","method":"desloc","workers":4,"kx":32,"ku":96,)"
      R"("kv":192,"outer":"none","parameters":1234,"future_field":[1,2,{"a":null}]})"
      "\n";
  const double val[] = {7.0, 6.5, 6.0, 5.5, 5.2};
  for (int t = 1; t <= 10; ++t) {
    s += "{\"type\":\"train\",\"step\":" + std::to_string(t) +
         ",\"loss\":" + std::to_string(10.0 - 0.5 * t) +
         ",\"lr\":0.001,\"grad_norm\":null,\"tokens_per_s\":" + std::to_string(1000 + 100 * t) +
         ",\"step_ms\":1.5,\"tokens\":100,\"bytes_sent\":" + std::to_string(1000 * t) +
         ",\"bytes_by_state\":{\"grad\":0,\"x\":" + std::to_string(600 * t) +
         ",\"u\":" + std::to_string(300 * t) + ",\"v\":" + std::to_string(100 * t) + "}}\n";
    if (t % 2 == 0)
      s += "{\"type\":\"eval\",\"step\":" + std::to_string(t) +
           ",\"val_loss\":" + std::to_string(val[t / 2 - 1]) + ",\"eval_s\":0.1}\n";
  }
  s += "{\"type\":\"checkpoint\",\"step\":10}\n";  // an unknown record type
  return s;
}

// Run B (ddp): 100000 bytes per step (total 1e6); val 6.8 6.2 5.9 5.8 5.6: the worst final, so
// the common target is 5.6.
std::string run_b() {
  std::string s = R"({"type":"run","name":"ddp","method":"ddp","workers":4})"
                  "\n";
  const double val[] = {6.8, 6.2, 5.9, 5.8, 5.6};
  for (int t = 1; t <= 10; ++t) {
    s += "{\"type\":\"train\",\"step\":" + std::to_string(t) +
         ",\"loss\":6,\"tokens_per_s\":2000,\"bytes_sent\":" + std::to_string(100000 * t) + "}\n";
    if (t % 2 == 0)
      s += "{\"type\":\"eval\",\"step\":" + std::to_string(t) +
           ",\"val_loss\":" + std::to_string(val[t / 2 - 1]) + "}\n";
  }
  return s;
}

// Run C: no header (named after its directory), no communication; val 7.0 6.0 5.5.
std::string run_c() {
  std::string s;
  const double val[] = {7.0, 6.0, 5.5};
  for (int t = 1; t <= 6; ++t) {
    s += "{\"type\":\"train\",\"step\":" + std::to_string(t) +
         ",\"loss\":5.75,\"tokens_per_s\":500,\"bytes_sent\":0}\n";
    if (t % 2 == 0)
      s += "{\"type\":\"eval\",\"step\":" + std::to_string(t) +
           ",\"val_loss\":" + std::to_string(val[t / 2 - 1]) + "}\n";
  }
  return s;
}

}  // namespace

// --- JSON parser

TEST(Json, ParsesScalarsObjectsArraysAndEscapes) {
  const JsonValue v =
      parse_json(R"( {"a":1.5e2,"b":-0.25,"s":"q\"\\\/\n\t\u00e9\ud83d\ude00","t":true,"f":false,)"
                 R"("n":null,"o":{"k":[1,[2],{}]},"e":[]} )",
                 "x:1");
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.number_or_nan("a"), 150.0);
  EXPECT_EQ(v.number_or_nan("b"), -0.25);
  EXPECT_EQ(v.string_or("s", ""), "q\"\\/\n\t\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_TRUE(v.find("t")->boolean);
  EXPECT_EQ(v.find("f")->kind, JsonValue::Kind::kBool);
  EXPECT_FALSE(v.find("f")->boolean);
  EXPECT_TRUE(v.find("n")->is_null());
  EXPECT_TRUE(std::isnan(v.number_or_nan("n")));        // null reads as NaN
  EXPECT_TRUE(std::isnan(v.number_or_nan("missing")));  // so does a missing member
  const JsonValue* k = v.find("o")->find("k");
  ASSERT_NE(k, nullptr);
  ASSERT_EQ(k->array.size(), 3u);
  EXPECT_EQ(k->array[1].array[0].number, 2.0);
  EXPECT_TRUE(k->array[2].is_object());
  EXPECT_TRUE(v.find("e")->array.empty());
}

// The writer and the reader of metrics.jsonl share one definition: every record the trainer
// writes reads back field for field (non-finite numbers as NaN).
TEST(MetricsRecords, WhatTheTrainerWritesTheReportReadsBack) {
  train::TrainRecord t;
  t.step = 120;
  t.loss = 2.12954187f;
  t.lr = 3e-4f;
  t.grad_norm = std::numeric_limits<float>::quiet_NaN();
  t.tokens_per_s = 4096.5;
  t.step_ms = 61.25;
  t.tokens = 491520;
  t.workers = 2;
  t.synced = "xu";
  t.wire = {0, 1000, 2000, 0};
  t.payload = {0, 4000, 4000, 0};
  t.wire_by_worker = {3000, 3000};
  t.loss_by_site = {2.1f, 2.15890122f};
  t.site_bytes_sent = 77;
  t.region_bytes_sent = 99;
  const auto back = read_train_record(parse_json(t.to_json(), "t"), "t");
  EXPECT_EQ(back.step, t.step);
  EXPECT_EQ(back.loss, 2.129542);  // written with 7 significant digits
  EXPECT_FLOAT_EQ(float(back.lr), float(t.lr));
  EXPECT_TRUE(std::isnan(back.grad_norm));
  EXPECT_DOUBLE_EQ(back.tokens_per_s, t.tokens_per_s);
  EXPECT_DOUBLE_EQ(back.step_ms, t.step_ms);
  EXPECT_EQ(back.tokens, t.tokens);
  EXPECT_EQ(back.workers, t.workers);
  EXPECT_EQ(back.synced, t.synced);
  EXPECT_EQ(back.wire, t.wire);
  EXPECT_EQ(back.payload, t.payload);
  EXPECT_EQ(back.wire_by_worker, t.wire_by_worker);
  EXPECT_EQ(back.loss_by_site, t.loss_by_site);  // exact: 9 significant digits
  EXPECT_EQ(back.site_bytes_sent, t.site_bytes_sent);
  EXPECT_EQ(back.region_bytes_sent, t.region_bytes_sent);

  train::RunRecord h;
  h.name = "quick \"start\"";
  h.method = "desloc";
  h.workers = 2;
  h.kx = 16;
  h.ku = 48;
  h.outer = "none";
  h.parameters = 34688;
  h.batch = 8;
  h.seq_len = 128;
  h.steps = 600;
  h.config_hash = 0x22da55861280f3a8ULL;
  h.sites = "west,east";
  h.ranks_per_site = 2;
  h.rank = "west/0";
  h.wan_link = "west/0->east/0";
  const auto run = read_run_record(parse_json(h.to_json(), "h"));
  EXPECT_EQ(run.name, h.name);
  EXPECT_EQ(run.kx, h.kx);
  EXPECT_EQ(run.ku, h.ku);
  EXPECT_FALSE(run.kv.has_value());
  EXPECT_EQ(run.config_hash, h.config_hash);
  EXPECT_EQ(run.sites, h.sites);
  EXPECT_EQ(run.ranks_per_site, h.ranks_per_site);
  EXPECT_EQ(run.wan_link, h.wan_link);
  EXPECT_EQ(run.parameters, h.parameters);

  const train::EvalRecord e{600, 2.13, 0.5, 2};
  const auto eval = read_eval_record(parse_json(e.to_json(), "e"), "e");
  EXPECT_EQ(eval.step, e.step);
  EXPECT_EQ(eval.val_loss, e.val_loss);
  EXPECT_EQ(eval.workers, e.workers);
}

TEST(Json, RejectsMalformedInputWithPlace) {
  const char* bad[] = {"{",
                       R"({"a":})",
                       R"({"a":1,})",
                       R"({"a" 1})",
                       R"({a:1})",
                       R"({"a":01})",
                       R"({"a":1.})",
                       R"({"a":.5})",
                       R"({"a":tru})",
                       R"({"a":"x)",
                       "{\"a\":\"\x01\"}",
                       R"({"a":"\q"})",
                       R"({"a":"\ud800"})",
                       R"({"a":1} x)",
                       R"({"a":1,"a":2})",
                       R"([1 2])",
                       R"({"a":NaN})",
                       R"({"a":+1})",
                       ""};
  for (const char* text : bad) {
    try {
      parse_json(text, "runs/m.jsonl:7");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const DataError& e) {
      EXPECT_NE(e.message().find("runs/m.jsonl:7:"), std::string::npos) << e.message();
    }
  }
  std::string deep(200, '[');
  EXPECT_THROW(parse_json(deep + std::string(200, ']'), "d:1"), DataError);
}

TEST_F(ReportFiles, JsonlNamesFileAndLineOfABadLine) {
  const auto path = write("m.jsonl", "{\"type\":\"train\",\"step\":1}\n\n{\"step\":2,}\n{}\n");
  try {
    read_jsonl(path);
    FAIL() << "accepted a malformed line";
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find(path + ":3:"), std::string::npos) << e.message();
  }
}

TEST_F(ReportFiles, JsonlDropsOnlyAnIncompleteLastLine) {
  // A trainer may be half-way through writing its last line.
  const auto path = write("m.jsonl", "{\"a\":1}\n\n{\"b\":2}\n{\"type\":\"tr");
  const auto lines = read_jsonl(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1].line, 3u);
  EXPECT_THROW(read_jsonl((dir_ / "missing.jsonl").string()), DataError);
}

TEST_F(ReportFiles, TrainRecordWithoutStepIsAnError) {
  const auto path = write("r/metrics.jsonl",
                          "{\"type\":\"train\",\"step\":1,\"loss\":2}\n"
                          "{\"type\":\"train\",\"loss\":2}\n");
  try {
    load_run(path);
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find(path + ":2"), std::string::npos) << e.message();
  }
}

// --- SVG chart

TEST(SvgChart, OnePolylinePerSeriesWithNamesAndAxes) {
  Series a{"alpha", {0, 1, 2, 3}, {4, 3, 2.5, 2}};
  Series b{"beta", {0, 1, 2, 3}, {5, 4, 3, 2.8}};
  const std::string svg =
      svg_line_chart({a, b}, {"Loss vs step", "step", "loss (nats)", false, false, 640, 400});
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(polyline_sizes(svg), (std::vector<std::size_t>{4, 4}));
  for (const char* s : {"alpha", "beta", "Loss vs step", "step", "loss (nats)"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;
  EXPECT_NE(svg.find(series_colour(0)), std::string::npos);
  EXPECT_NE(svg.find(series_colour(1)), std::string::npos);
  EXPECT_NE(series_colour(0), series_colour(1));
  // 1-2-5 ticks: y spans 2..5 (3 units / ~5 ticks = 0.6, rounded to a 0.5 step).
  for (const char* label : {">2.0<", ">2.5<", ">3.0<", ">5.0<"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
}

TEST(SvgChart, LogAxisSkipsNonPositiveAndNonFinite) {
  Series s{"bytes", {-5, 0, 10, 100, 1000, NAN}, {1, 2, 3, INFINITY, 5, 6}};
  const std::string svg = svg_line_chart({s}, {"t", "x", "y", true, false, 720, 420});
  EXPECT_EQ(polyline_sizes(svg), (std::vector<std::size_t>{2}));  // (10,3) and (1000,5)
  // Decade ticks 10, 100, 1000 are labelled.
  for (const char* label : {">10<", ">100<", ">1000<"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(SvgChart, EscapesText) {
  Series s{"a<b & \"c\"", {1, 2}, {1, 2}};
  const std::string svg = svg_line_chart({s}, {"x > y & 'z'", "", "", false, false, 720, 420});
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg.find("x &gt; y &amp; &#39;z&#39;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(xml_escape("<&>\"'"), "&lt;&amp;&gt;&quot;&#39;");
}

TEST(SvgChart, DegenerateInputsStayFinite) {
  const std::vector<std::vector<Series>> cases = {
      {},                                      // no series
      {Series{"empty", {}, {}}},               // a series without points
      {Series{"one", {5}, {2}}},               // a single point
      {Series{"flat", {1, 2, 3}, {0, 0, 0}}},  // a constant at zero
      {Series{"flat", {7, 7}, {3, 3}}},        // one x value
      {Series{"ragged", {1, 2, 3}, {1}}},      // mismatched lengths
  };
  for (const auto& series : cases)
    for (bool log : {false, true}) {
      const std::string svg = svg_line_chart(series, {"t", "x", "y", log, log, 300, 200});
      EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
      EXPECT_EQ(svg.find("inf"), std::string::npos) << svg;
      EXPECT_EQ(polyline_sizes(svg).size(), series.size());
    }
  EXPECT_NE(svg_line_chart({}, {}).find("no data"), std::string::npos);
}

TEST_F(ReportFiles, WriteSvgFile) {
  const std::string path = (dir_ / "c.svg").string();
  write_svg_file(path, svg_line_chart({Series{"a", {1, 2}, {3, 4}}}, {}));
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
}

// --- the report

TEST_F(ReportFiles, LoadRunReadsHeaderRecordsAndBytesAtEval) {
  const RunSeries a = load_run(write("a/metrics.jsonl", run_a()));
  EXPECT_EQ(a.name, "desloc-kx32");
  EXPECT_EQ(a.method, "desloc");
  EXPECT_EQ(a.settings, "workers=4 kx=32 ku=96 kv=192");
  ASSERT_EQ(a.train.size(), 10u);
  ASSERT_EQ(a.eval.size(), 5u);
  EXPECT_EQ(a.eval[3].step, 8);
  EXPECT_EQ(a.eval[3].bytes_sent, 8000.0);
  EXPECT_DOUBLE_EQ(a.eval[3].elapsed_s, 8 * 1.5e-3);  // eight steps of 1.5 ms
  EXPECT_EQ(a.train[9].step_ms, 1.5);
  EXPECT_EQ(a.train[9].bytes_by_state[1], 6000.0);  // x
  // A re-planned run (sync.replan) says where its periods went.
  const RunSeries replanned = load_run(write(
      "r/metrics.jsonl", run_a() +
                             "{\"type\":\"replan\",\"step\":320,\"kx\":263,\"ku\":789,\"kv\":1578,"
                             "\"old_kx\":32,\"reason\":\"slow\"}\n"
                             "{\"type\":\"replan\",\"step\":2687,\"kx\":32,\"ku\":96,\"kv\":192,"
                             "\"old_kx\":263,\"reason\":\"fast\"}\n"));
  EXPECT_EQ(replanned.settings,
            "workers=4 kx=32 ku=96 kv=192 re-planned kx to 263 after 320, 32 after 2687");
  const RunSeries c = load_run(write("local-only/metrics.jsonl", run_c()));
  EXPECT_EQ(c.name, "local-only");  // no header: the directory names the run
  EXPECT_TRUE(c.method.empty());
  EXPECT_TRUE(std::isnan(c.eval[0].elapsed_s));  // no step times: no training time
}

TEST_F(ReportFiles, SummaryMatchesClosedForm) {
  const std::vector<RunSeries> runs = {load_run(write("a/metrics.jsonl", run_a())),
                                       load_run(write("b/metrics.jsonl", run_b())),
                                       load_run(write("local-only/metrics.jsonl", run_c()))};
  const double target = common_val_target(runs);
  EXPECT_DOUBLE_EQ(target, 5.6);  // run B's final val loss is the worst
  const RunSummary a = summarize(runs[0], target);
  EXPECT_EQ(a.steps, 10);
  EXPECT_DOUBLE_EQ(a.final_train_loss, 5.0);
  EXPECT_DOUBLE_EQ(a.final_val_loss, 5.2);
  EXPECT_DOUBLE_EQ(a.best_val_loss, 5.2);
  EXPECT_EQ(a.total_bytes, 10000.0);
  EXPECT_EQ(a.step_to_target, 8);  // 5.5 <= 5.6 first at step 8
  EXPECT_EQ(a.bytes_to_target, 8000.0);
  EXPECT_DOUBLE_EQ(a.seconds_to_target, 8 * 1.5e-3);
  EXPECT_DOUBLE_EQ(a.total_seconds, 10 * 1.5e-3);
  EXPECT_DOUBLE_EQ(a.mean_tokens_per_s, 1550.0);
  const RunSummary b = summarize(runs[1], target);
  EXPECT_EQ(b.step_to_target, 10);
  EXPECT_EQ(b.bytes_to_target, 1e6);
  EXPECT_EQ(b.total_bytes, 1e6);
  EXPECT_TRUE(std::isnan(b.seconds_to_target));  // run B records no step times
  EXPECT_TRUE(std::isnan(b.total_seconds));
  const RunSummary c = summarize(runs[2], target);
  EXPECT_EQ(c.total_bytes, 0.0);
  EXPECT_EQ(c.step_to_target, 6);
  EXPECT_TRUE(std::isnan(summarize(RunSeries{}, target).final_val_loss));
}

TEST_F(ReportFiles, HtmlIsSelfContainedAndHoldsTheTable) {
  const std::string out = (dir_ / "out" / "report.html").string();
  fs::create_directories(dir_ / "out");
  write_report({write("a/metrics.jsonl", run_a()), write("b/metrics.jsonl", run_b()),
                write("local-only/metrics.jsonl", run_c())},
               out, "Brown <corpus> & friends");
  std::ifstream in(out);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("Brown &lt;corpus&gt; &amp; friends"), std::string::npos);
  for (const char* name : {"desloc-kx32", "ddp", "local-only"})
    EXPECT_NE(html.find(name), std::string::npos) << name;
  // Run A: final/best val 5.2, total 10000 B, 8000 B to the 5.6 target at step 8, 1550 tokens/s,
  // 1/100 of DDP's bytes; run C is marked as silent.
  for (const char* cell :
       {"<td>5.2000</td>", "title=\"10000 bytes\">9.77 KiB", "title=\"8000 bytes\"", "<td>8</td>",
        "<td>1550</td>", "<td>1/100</td>", "title=\"1000000 bytes\"", "no communication", "5.6000",
        "<td>1 (most)</td>", "workers=4 kx=32 ku=96 kv=192"})
    EXPECT_NE(html.find(cell), std::string::npos) << cell;
  // Five charts; one line per run in each (the silent run's line is empty on log-bytes charts,
  // and the untimed runs' lines are empty on the time chart).
  EXPECT_EQ(count(html, "<svg "), 5u);
  EXPECT_EQ(count(html, "<polyline"), 15u);
  EXPECT_NE(html.find("Validation loss vs training time"), std::string::npos);
  EXPECT_NE(html.find("local-only (no communication)"), std::string::npos);
  // Self-contained: no URL at all, not even the SVG namespace.
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("nan"), std::string::npos);
}

TEST_F(ReportFiles, DuplicateNamesAreToldApartAndNoRunsStillRenders) {
  const auto a = load_run(write("a/metrics.jsonl", run_a()));
  const std::string html = render_report_html({a, a}, "dup");
  EXPECT_NE(html.find("desloc-kx32 (2)"), std::string::npos);
  EXPECT_NE(render_report_html({}, "none").find("No runs"), std::string::npos);
}

TEST(TopologySvg, DiagramDrawsEverySiteLinkAndRingArrowAndTheHeatmapEveryCell) {
  std::string text =
      "[[site]]\nname = \"A\"\nstep_ms = 80\n[[site]]\nname = \"B&C\"\nstep_ms = 90\n"
      "[[site]]\nname = \"D\"\nstep_ms = 85\n";
  for (const char* a : {"A", "B&C", "D"})
    for (const char* b : {"A", "B&C", "D"})
      if (std::string(a) != b)
        text += std::string("[[link]]\nfrom = \"") + a + "\"\nto = \"" + b +
                "\"\nbandwidth_mbit = " + (std::string(a) == "A" ? "950" : "95.5") +
                "\nlatency_ms = 0.1\n";
  const auto t = topology::parse_topology(text, "t.toml");
  const std::string d = svg_topology_diagram(t, {"A", "B&C", "D"}, "het <3>");
  auto count = [](const std::string& s, const std::string& what) {
    std::size_t n = 0;
    for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(d, "<circle"), 3u);
  EXPECT_EQ(count(d, "marker-end"), 3u);            // A->B&C->D->A
  EXPECT_NE(d.find("B&amp;C"), std::string::npos);  // escaped
  EXPECT_NE(d.find("het &lt;3&gt;"), std::string::npos);
  EXPECT_NE(d.find("A&gt;B&amp;C 950 Mbit/s"), std::string::npos) << "asymmetric link label";
  EXPECT_EQ(d.find("B&C"), std::string::npos);
  const std::string h = svg_bandwidth_heatmap(t, "matrix");
  EXPECT_EQ(count(h, "<rect"), 1u + 9u);  // the background and 3 x 3 cells
  EXPECT_NE(h.find("950 Mbit/s"), std::string::npos);
  EXPECT_NE(h.find("96 Mbit/s"), std::string::npos);
}
