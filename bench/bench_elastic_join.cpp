// Question: when the number of workers doubles mid-run, how much does the validation loss
// jump for DES-LOC and Local Adam against the heuristics FAVG+OPT and state reset (the paper's
// robustness experiment)? M in-process virtual workers on the Brown corpus (issue 3).
//
// Each method runs twice with identical settings: once with M workers throughout, once growing
// to 2M at join_step (new workers start from the average at the next sync; under keep-local
// methods they start Adam afresh, see the trainer). The perturbation is the largest excess of
// the join run's validation loss over the no-join run's at the same step, over the evaluations
// in the window after the join, and the excess at the end.
//
//   bench_elastic_join [--data data/brown] [--out-dir bench_out/elastic_join] [--steps 1536]
//                      [--join 768] [--kx 32] [--workers 2] [--threads 2]
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/report/report.hpp"
#include "desloc/train/trainer.hpp"
#include "lm_bench_common.hpp"

namespace {
namespace fs = std::filesystem;
using namespace desloc;

struct Options {
  std::string data = "data/brown";
  std::string out_dir = "bench_out/elastic_join";
  std::int64_t steps = 1536;
  std::int64_t join = 768;
  std::int64_t kx = 32;
  int sites = 2;
  int threads = 2;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::Flags(
      "bench_elastic_join [--data DIR] [--out-dir DIR] [--steps N] [--join STEP] [--kx K] "
      "[--workers M] [--threads T]")
      .add("--data", o.data)
      .add("--out-dir", o.out_dir)
      .add("--steps", o.steps)
      .add("--join", o.join)
      .add("--kx", o.kx)
      .add("--workers", o.sites)
      .add("--threads", o.threads)
      .parse(argc, argv);
  if (o.join <= 0 || o.join >= o.steps) throw ConfigError("--join must lie inside (0, --steps)");
  return o;
}

std::map<std::int64_t, double> val_by_step(const report::RunSeries& r) {
  std::map<std::int64_t, double> m;
  for (const auto& e : r.eval) m[e.step] = e.val_loss;
  return m;
}

int run(const Options& o) {
  bench::ensure_brown(o.data);
  const int eval_every = static_cast<int>(std::max<std::int64_t>(1, o.kx / 2));
  const std::int64_t window = 8 * o.kx;  // evaluations this long after the join count
  struct Method {
    const char* label;
    const char* method;
  };
  const Method methods[] = {{"desloc", "desloc"},
                            {"local_adam", "local_adam"},
                            {"favg", "favg"},
                            {"reset", "favg_reset"}};
  std::printf(
      "bench_elastic_join: %d -> %d workers at step %lld of %lld, Kx = %lld (DES-LOC Ku = 3Kx, Kv "
      "= 6Kx), "
      "eval every %d steps\n",
      o.sites, 2 * o.sites, static_cast<long long>(o.join), static_cast<long long>(o.steps),
      static_cast<long long>(o.kx), eval_every);

  std::vector<std::string> paths;
  std::printf("\n%-12s %12s %12s %18s %14s %12s\n", "method", "final (base)", "final (join)",
              "max excess (window)", "at step", "final excess");
  std::printf("%s\n", std::string(86, '-').c_str());
  for (const auto& m : methods) {
    std::map<std::int64_t, double> val[2];
    double final_loss[2] = {0, 0};
    for (int joined = 0; joined < 2; ++joined) {
      train::JobConfig cfg = bench::small_lm_job(o.data, o.steps, eval_every, o.threads, o.sites);
      cfg.sync.method = *desloc::parse_sync_method(m.method);
      cfg.sync.kx = o.kx;
      if (joined) {
        cfg.sync.join_step = o.join;
        cfg.sync.join_sites = 2 * o.sites;
      }
      cfg.train.out_dir =
          (fs::path(o.out_dir) / fmt::format("{}_{}", m.label, joined ? "join" : "base")).string();
      fs::remove_all(cfg.train.out_dir);
      const auto r = train::run_training(cfg, {.progress = 0});
      if (joined && r.sites != 2 * o.sites)
        throw Error(fmt::format("validation failed: {} ended with {} workers, expected {}", m.label,
                                r.sites, 2 * o.sites));
      const auto series = report::load_run(train::metrics_path(cfg));
      val[joined] = val_by_step(series);
      final_loss[joined] = r.last_val_loss;
      paths.push_back(series.path);
    }
    if (val[0].size() != val[1].size())
      throw Error("validation failed: the two runs evaluated at different steps");
    double max_excess = -1e9;
    std::int64_t at = -1;
    for (const auto& [step, v] : val[1]) {
      if (step < o.join || step > o.join + window) continue;
      const double excess = v - val[0].at(step);
      if (excess > max_excess) {
        max_excess = excess;
        at = step;
      }
    }
    std::printf("%-12s %12.4f %12.4f %+18.4f %14lld %+12.4f\n", m.label, final_loss[0],
                final_loss[1], max_excess, static_cast<long long>(at),
                final_loss[1] - final_loss[0]);
  }
  std::printf(
      "(excess = validation loss of the run that doubled its workers minus that of the run that "
      "did not, "
      "at the same step; window = %lld steps after the join)\n",
      static_cast<long long>(window));
  const std::string html = (fs::path(o.out_dir) / "report.html").string();
  report::write_report(paths, html, "Elastic join: workers doubled mid-run");
  std::printf("report: %s\n", html.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const desloc::Error& e) {
    std::fprintf(stderr, "bench_elastic_join: %s\n", e.message().c_str());
    return 1;
  }
}
