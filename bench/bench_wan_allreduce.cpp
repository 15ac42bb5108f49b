// Question: on shaped wide-area links, how close does desloc's UCX ring all-reduce come to the
// link rate, and is it at least as fast as torch.distributed gloo and Open MPI in the same run?
// This program is two things that bench/bench_wan_allreduce.sh drives (see docs/benchmarks.md):
//
//   bench_wan_allreduce rank --rank R --size N --exchange-dir DIR --out FILE --bytes B
//       [--device DEV] [--rndv-thresh inf] [--chunk-bytes 1048576] [--inflight 8]
//       [--spin-iterations 0] [--linger-us 0] [--warmup 1] [--repeats 5] [--deadline-s 120]
//       [--idle-ms 0]
//     One rank of an N-rank UCX group (one process per site, started inside the site's network
//     namespace). Ranks find each other through files in DIR; the rank validates, warms up,
//     times `repeats` all-reduces of B bytes and writes one JSON record to FILE. --idle-ms
//     leaves the links idle that long before each all-reduce, as DES-LOC's syncs do (TCP's
//     congestion window restarts after an idle period: docs/transport.md). --lane-share S
//     (3+ ranks) times the trainer's own average instead (sync::CollectiveAverager) over the
//     ring and its reverse, S of the buffer on the ring: bench/bench_lanes.sh compares shares.
//
//   bench_wan_allreduce report --scenario DIR      one scenario's table, from the ranks' records
//   bench_wan_allreduce summary --results DIR      one row per scenario and the targets
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_wan_allreduce_common.hpp"
#include "desloc/core/error.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/ucx_collective.hpp"
#include "harness.hpp"
#include "lm_bench_common.hpp"

namespace {
namespace fs = std::filesystem;
using namespace desloc;
using Clock = std::chrono::steady_clock;

// At MTU 1500 a 1514-byte frame carries 1448 bytes of TCP payload: the most any TCP transport
// can get out of a shaped link (docs/netbed.md).
constexpr double kTcpCeiling = 0.956;
constexpr double kTargetBusbwFraction = 0.90;  // of the bottleneck link's configured rate
constexpr double kTargetSpeedup = 1.0;         // desloc time vs the faster peer
const std::vector<std::string> kImpls = {"desloc", "gloo", "mpi"};

// "16 MiB", "1.5 MiB": message sizes are powers of two here.
std::string mib(double bytes) {
  const double m = bytes / (1 << 20);
  return bench::fmt(m, m == static_cast<long long>(m) ? 0 : 2) + " MiB";
}

// ---------------------------------------------------------------------------------------------
// Address exchange between processes in different network namespaces: they share the
// filesystem, so each rank's UCX worker address is a file.

class FileAddressExchange final : public transport::AddressExchange {
 public:
  explicit FileAddressExchange(fs::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw ConfigError("cannot create the address directory " + dir_.string());
  }

  // Written to a temporary name and renamed, so a reader sees the whole address or nothing.
  void publish(int rank, transport::WorkerAddress address) override {
    const fs::path tmp =
        dir_ / (".rank-" + std::to_string(rank) + ".addr." + std::to_string(::getpid()));
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(address.data()),
              static_cast<std::streamsize>(address.size()));
      f.flush();
      if (!f) throw TransportError("cannot write the UCX address to " + tmp.string());
    }
    std::error_code ec;
    fs::rename(tmp, path_of(rank), ec);
    if (ec)
      throw TransportError("cannot publish the UCX address as " + path_of(rank).string() + ": " +
                           ec.message());
  }

  transport::WorkerAddress lookup(int rank, Clock::time_point deadline) override {
    const fs::path p = path_of(rank);
    while (true) {
      std::ifstream f(p, std::ios::binary);
      if (f) {
        transport::WorkerAddress a;
        char buf[4096];
        while (f.read(buf, sizeof buf) || f.gcount() > 0) {
          const auto* b = reinterpret_cast<const std::byte*>(buf);
          a.insert(a.end(), b, b + f.gcount());
        }
        if (!a.empty()) return a;
      }
      if (Clock::now() >= deadline)
        throw TimeoutError("rank " + std::to_string(rank) + " never published its UCX address (" +
                           p.string() + "): did its process start? see its log");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  fs::path path_of(int rank) const { return dir_ / ("rank-" + std::to_string(rank) + ".addr"); }
  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------
// rank

struct RankOptions {
  int rank = -1;
  int size = 0;
  std::string exchange_dir;
  std::string out;
  std::int64_t bytes = 16 << 20;
  std::string device;  // default: $UCX_NET_DEVICES, which `netbed.sh exec` sets
  std::string rndv_thresh = "inf";
  std::int64_t chunk_bytes = 1 << 20;
  int inflight = 8;
  int spin_iterations = 0;  // as the trainer's wide-area groups (transport.wan_spin_iterations)
  int linger_us = 0;        // as transport.wan_linger_us
  int warmup = 1;
  int repeats = 5;
  int deadline_s = 120;
  int idle_ms = 0;
  double lane_share = 0;  // > 0: two lanes through CollectiveAverager, this part on the ring
};

// Runs `op` (an all-reduce, or an average) on the pattern, timed from a barrier, and checks
// every element against `expected` (the closed-form sums, or means).
template <typename Op>
void checked_run(transport::Collective& c, std::vector<float>& x,
                 const std::vector<float>& expected, double* ms, int idle_ms, const char* what,
                 Op op) {
  bench::wan::fill_pattern(x.data(), x.size(), c.rank());
  if (idle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
  c.barrier();  // every rank starts the timed operation together
  const double t0 = bench::now_s();
  op();
  const double t1 = bench::now_s();
  if (ms) *ms = 1e3 * (t1 - t0);
  const std::size_t bad = bench::wan::first_mismatch(x.data(), x.size(), expected);
  if (bad != x.size())
    throw DataError("rank " + std::to_string(c.rank()) + ": " + what + " result wrong at element " +
                    std::to_string(bad) + ": got " + bench::fmt(x[bad], 3) + ", expected " +
                    bench::fmt(expected[bad % bench::wan::kPeriod], 3));
}

void checked_all_reduce(transport::Collective& c, std::vector<float>& x,
                        const std::vector<float>& expected, double* ms, int idle_ms = 0) {
  checked_run(c, x, expected, ms, idle_ms, "all-reduce", [&] { c.all_reduce_sum(x); });
}

// The same through the trainer's averager (both lanes): `expected` holds the means.
void checked_average(transport::Collective& c, sync::CollectiveAverager& avg, std::vector<float>& x,
                     const std::vector<float>& expected, double* ms, int idle_ms) {
  std::span<float> one(x);
  checked_run(c, x, expected, ms, idle_ms, "average", [&] {
    avg.average(optim::StateKind::kU, std::span<const std::span<float>>(&one, 1));
  });
}

int run_rank(int argc, char** argv) {
  RankOptions o;
  bench::Flags(
      "bench_wan_allreduce rank --rank R --size N --exchange-dir DIR --out FILE [--bytes B] "
      "[--device DEV] [--rndv-thresh inf|auto|BYTES] [--chunk-bytes B] [--inflight K] "
      "[--spin-iterations N] [--linger-us U] [--warmup W] [--repeats R] [--deadline-s S] "
      "[--idle-ms T] "
      "[--lane-share S]")
      .add("--rank", o.rank)
      .add("--size", o.size)
      .add("--exchange-dir", o.exchange_dir)
      .add("--out", o.out)
      .add("--bytes", o.bytes)
      .add("--device", o.device)
      .add("--rndv-thresh", o.rndv_thresh)
      .add("--chunk-bytes", o.chunk_bytes)
      .add("--inflight", o.inflight)
      .add("--spin-iterations", o.spin_iterations)
      .add("--linger-us", o.linger_us)
      .add("--warmup", o.warmup)
      .add("--repeats", o.repeats)
      .add("--deadline-s", o.deadline_s)
      .add("--idle-ms", o.idle_ms)
      .add("--lane-share", o.lane_share)
      .parse(argc, argv);
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
    throw ConfigError("--rank must lie in [0, --size); got rank " + std::to_string(o.rank) +
                      " of " + std::to_string(o.size));
  if (o.exchange_dir.empty() || o.out.empty())
    throw ConfigError("--exchange-dir and --out are required");
  if (o.bytes <= 0 || o.bytes % 4 != 0)
    throw ConfigError("--bytes must be a positive multiple of 4 (float32)");
  if (o.repeats < 1 || o.warmup < 0) throw ConfigError("--repeats >= 1 and --warmup >= 0");
  if (o.idle_ms < 0) throw ConfigError("--idle-ms must be >= 0");
  if (o.linger_us < 0 || o.linger_us > 1000000)
    throw ConfigError("--linger-us must lie in [0, 1000000]");
  if (o.lane_share != 0 && !(o.lane_share > 0 && o.lane_share < 1 && o.size >= 3))
    throw ConfigError("--lane-share must lie in (0, 1), with --size >= 3 (two lanes)");
  if (o.device.empty()) {
    const char* d = std::getenv("UCX_NET_DEVICES");
    if (!d || !*d)
      throw ConfigError("no --device and no UCX_NET_DEVICES: run inside `netbed.sh exec`");
    o.device = d;
  }

  FileAddressExchange exchange(o.exchange_dir);
  transport::CollectiveOptions copt;
  copt.deadline = std::chrono::milliseconds(1000LL * o.deadline_s);
  copt.chunk_bytes = static_cast<std::size_t>(o.chunk_bytes);
  copt.max_inflight_chunks = static_cast<std::size_t>(o.inflight);
  transport::UcxOptions ucx;
  ucx.tls = "tcp";  // the only UCX transport that crosses namespaces (and the shaped link)
  ucx.net_devices = o.device;
  ucx.rndv_thresh = o.rndv_thresh == "auto" ? "" : o.rndv_thresh;
  ucx.spin_iterations = o.spin_iterations;
  ucx.linger_us = o.linger_us;
  auto c = transport::make_ucx_collective(o.rank, o.size, exchange, copt, ucx);
  // The second lane: the reversed ring, its own group (rank reversed_rank), its own addresses.
  std::unique_ptr<transport::Collective> reverse;
  std::optional<sync::CollectiveAverager> averager;
  if (o.lane_share > 0) {
    FileAddressExchange reverse_exchange(fs::path(o.exchange_dir) / "reverse");
    reverse = transport::make_ucx_collective(transport::reversed_rank(o.rank, o.size), o.size,
                                             reverse_exchange, copt, ucx);
    averager.emplace(*c, nullptr, reverse.get(), o.lane_share);
  }

  std::vector<float> x(static_cast<std::size_t>(o.bytes) / sizeof(float));
  std::vector<float> expected = bench::wan::expected_sums(o.size);
  if (averager) {
    // The average divides the sum by the ranks, correctly rounded, as this does.
    for (float& e : expected) e /= static_cast<float>(o.size);
  }
  const auto checked = [&](double* ms, int idle_ms) {
    if (!averager) return checked_all_reduce(*c, x, expected, ms, idle_ms);
    checked_average(*c, *averager, x, expected, ms, idle_ms);
  };
  // The first all-reduce also connects the ring; it is validated like every later one.
  checked(nullptr, 0);
  for (int i = 0; i < o.warmup; ++i) checked(nullptr, o.idle_ms);
  std::vector<double> ms(static_cast<std::size_t>(o.repeats));
  for (double& m : ms) checked(&m, o.idle_ms);
  c->barrier();  // nobody tears down while a peer still needs its data
  if (reverse) reverse->barrier();
  const std::string extra =
      "\"rndv_thresh\":\"" + o.rndv_thresh + "\",\"chunk_bytes\":" + std::to_string(o.chunk_bytes) +
      ",\"inflight\":" + std::to_string(o.inflight) + ",\"idle_ms\":" + std::to_string(o.idle_ms) +
      ",\"device\":\"" + o.device + "\",\"lane_share\":" + bench::fmt(o.lane_share, 4);
  if (!bench::wan::write_record(o.out, "desloc", o.rank, o.size, x.size() * sizeof(float), o.warmup,
                                1 + o.warmup + o.repeats, ms, extra))
    throw bench::BenchError("cannot write " + o.out);
  std::fprintf(stderr, "desloc rank %d/%d: %d all-reduces of %s validated; median %.1f ms\n",
               o.rank, o.size, 1 + o.warmup + o.repeats, mib(double(o.bytes)).c_str(),
               bench::summarize(ms).median);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// report / summary

struct Scenario {
  fs::path dir;
  std::map<std::string, std::string> kv;  // scenario.txt
  std::string get(const std::string& k) const {
    auto it = kv.find(k);
    if (it == kv.end()) throw bench::BenchError(dir.string() + "/scenario.txt lacks " + k);
    return it->second;
  }
  double num(const std::string& k) const { return std::atof(get(k).c_str()); }
};

Scenario load_scenario(const fs::path& dir) {
  Scenario s;
  s.dir = dir;
  std::ifstream f(dir / "scenario.txt");
  if (!f) throw bench::BenchError("no " + (dir / "scenario.txt").string());
  std::string line;
  while (std::getline(f, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) s.kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return s;
}

// One implementation's result in one scenario: per-repeat time = the slowest rank's time.
struct ImplResult {
  bool ok = false;
  std::string why;  // when !ok
  bench::Stats ms;
  int validated = 0;
};

ImplResult load_impl(const Scenario& s, const std::string& impl) {
  ImplResult r;
  const int n = static_cast<int>(s.num("n"));
  if (std::ifstream e(s.dir / (impl + ".error")); e) {
    std::getline(e, r.why);
    return r;
  }
  std::vector<double> slowest;
  for (int rank = 0; rank < n; ++rank) {
    const fs::path p = s.dir / (impl + ".rank-" + std::to_string(rank) + ".json");
    std::ifstream f(p);
    std::string line;
    if (!f || !std::getline(f, line)) {
      r.why = "no record from rank " + std::to_string(rank);
      return r;
    }
    if (bench::json_number(line, "bytes") != s.num("bytes") ||
        bench::json_number(line, "size") != n) {
      r.why = "rank " + std::to_string(rank) + " ran another size or byte count";
      return r;
    }
    const std::vector<double> ms = bench::json_numbers(line, "samples_ms");
    if (rank == 0) slowest = ms;
    if (ms.size() != slowest.size() || ms.empty()) {
      r.why = "ranks disagree on the number of repeats";
      return r;
    }
    for (std::size_t i = 0; i < ms.size(); ++i) slowest[i] = std::max(slowest[i], ms[i]);
    const int v = static_cast<int>(bench::json_number(line, "validated"));
    r.validated = rank == 0 ? v : std::min(r.validated, v);
  }
  r.ok = true;
  r.ms = bench::summarize(slowest);
  return r;
}

// busbw (nccl-tests) in Mbit/s for `bytes` all-reduced over n ranks in `ms`.
double busbw_mbit(double bytes, int n, double ms) {
  const double algbw = bytes * 8 / (ms * 1e-3) / 1e6;
  return algbw * 2.0 * (n - 1) / n;
}

struct Verdict {
  std::string label, sites, rate, bytes, desloc_ms, fraction, gloo_ms, mpi_ms, speedup;
  bool met = false;
  bool desloc_ok = false;
};

std::string ms_cell(const ImplResult& r) {
  if (r.ok) return bench::fmt_stats(r.ms, 0);
  return r.why == "not run" ? "not run" : "failed";
}

Verdict report_scenario(const Scenario& s, bool print) {
  const int n = static_cast<int>(s.num("n"));
  const double bytes = s.num("bytes");
  const double bottleneck = s.num("bottleneck_mbit");
  const std::string ceiling_txt = s.kv.count("ceiling_mbit") ? s.get("ceiling_mbit") : "";
  const double ceiling = ceiling_txt.empty() ? 0.0 : std::atof(ceiling_txt.c_str());
  std::map<std::string, ImplResult> res;
  for (const auto& impl : kImpls) res[impl] = load_impl(s, impl);

  if (print) {
    std::printf("\n== %s: %d sites (%s), %s; %s float32 all-reduce; ring bottleneck %.0f Mbit/s\n",
                s.get("name").c_str(), n, s.get("sites").c_str(), s.get("rates").c_str(),
                mib(bytes).c_str(), bottleneck);
    if (ceiling > 0)
      std::printf(
          "   TCP goodput of the ring's links, %d concurrent iperf3 flows: slowest %.1f Mbit/s "
          "= %.3f of the rate (MTU-1500 ceiling %.3f)\n",
          n, ceiling, ceiling / bottleneck, kTcpCeiling);
    std::vector<std::string> failures;
    bench::Table t({"impl", "ms median [min-max]", "validated", "algbw Mbit/s", "busbw Mbit/s",
                    "busbw/rate", "busbw/goodput", "its time / desloc's"});
    for (const auto& impl : kImpls) {
      const ImplResult& r = res[impl];
      if (!r.ok) {
        t.add({impl, ms_cell(r)});
        if (r.why != "not run") failures.push_back(impl + " failed: " + r.why);
        continue;
      }
      const double bus = busbw_mbit(bytes, n, r.ms.median);
      t.add({impl, bench::fmt_stats(r.ms, 1), std::to_string(r.validated) + " runs",
             bench::fmt(bytes * 8 / (r.ms.median * 1e-3) / 1e6, 1), bench::fmt(bus, 1),
             bench::fmt(bus / bottleneck, 3), ceiling > 0 ? bench::fmt(bus / ceiling, 3) : "-",
             res["desloc"].ok ? bench::fmt(r.ms.median / res["desloc"].ms.median, 3) + "x" : "-"});
    }
    t.print();
    for (const auto& f : failures) std::printf("   %s\n", f.c_str());
  }

  Verdict v;
  v.label = s.get("name");
  v.sites = std::to_string(n);
  v.rate = s.get("link");
  v.bytes = mib(bytes);
  v.desloc_ms = ms_cell(res["desloc"]);
  v.gloo_ms = ms_cell(res["gloo"]);
  v.mpi_ms = ms_cell(res["mpi"]);
  v.desloc_ok = res["desloc"].ok;
  v.fraction = "-";
  v.speedup = "-";
  if (!res["desloc"].ok) return v;
  const double d = res["desloc"].ms.median;
  const double frac = busbw_mbit(bytes, n, d) / bottleneck;
  v.fraction = bench::fmt(frac, 3);
  double peer = 0;
  std::string peer_name;
  for (const std::string impl : {"gloo", "mpi"})
    if (res[impl].ok && (peer == 0 || res[impl].ms.median < peer)) {
      peer = res[impl].ms.median;
      peer_name = impl;
    }
  const bool frac_met = frac >= kTargetBusbwFraction;
  bool speed_met = false;
  if (peer > 0) {
    speed_met = peer / d >= kTargetSpeedup;
    v.speedup = bench::fmt(peer / d, 3) + "x (" + peer_name + ")";
  }
  v.met = frac_met && speed_met;
  if (print) {
    std::printf("   desloc busbw %.3f of the rate (target >= %.2f: %s); ", frac,
                kTargetBusbwFraction, frac_met ? "met" : "NOT met");
    if (peer > 0)
      std::printf("desloc vs the faster peer (%s): %.3fx (target >= %.1fx: %s)\n",
                  peer_name.c_str(), peer / d, kTargetSpeedup, speed_met ? "met" : "NOT met");
    else
      std::printf("no peer finished, so no speed ratio\n");
    std::fflush(stdout);
  }
  return v;
}

int run_report(int argc, char** argv) {
  std::string dir;
  bench::Flags("bench_wan_allreduce report --scenario DIR")
      .add("--scenario", dir)
      .parse(argc, argv);
  if (dir.empty()) throw ConfigError("--scenario DIR is required");
  report_scenario(load_scenario(dir), true);
  return 0;
}

int run_summary(int argc, char** argv) {
  std::string dir;
  bench::Flags("bench_wan_allreduce summary --results DIR").add("--results", dir).parse(argc, argv);
  if (dir.empty()) throw ConfigError("--results DIR is required");
  std::vector<fs::path> scenarios;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && fs::exists(e.path() / "scenario.txt")) scenarios.push_back(e.path());
  std::sort(scenarios.begin(), scenarios.end());  // the driver numbers them in run order
  if (scenarios.empty()) throw bench::BenchError("no scenario results under " + dir);
  bench::Table t({"scenario", "sites", "link rate", "bytes", "desloc ms", "busbw/rate", "gloo ms",
                  "MPI ms", "desloc vs faster peer"});
  int missed = 0, failed = 0;
  for (const auto& p : scenarios) {
    const Verdict v = report_scenario(load_scenario(p), false);
    t.add({v.label, v.sites, v.rate, v.bytes, v.desloc_ms, v.fraction, v.gloo_ms, v.mpi_ms,
           v.speedup});
    missed += v.met ? 0 : 1;
    failed += v.desloc_ok ? 0 : 1;
  }
  std::printf(
      "\nSummary (ms = median [min-max] of the slowest rank per repeat; busbw = bytes/time"
      " x 2(n-1)/n, over the ring's bottleneck rate; target busbw/rate >= %.2f, "
      "TCP ceiling %.3f; target desloc vs faster peer >= %.1fx)\n",
      kTargetBusbwFraction, kTcpCeiling, kTargetSpeedup);
  t.print();
  std::printf("load average now: %s\n", bench::load_average().c_str());
  if (failed) {
    std::printf("desloc failed in %d scenario(s)\n", failed);
    return 1;
  }
  std::printf("targets met in %zu of %zu scenarios\n", scenarios.size() - missed, scenarios.size());
  return missed ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "rank") return run_rank(argc - 1, argv + 1);
    if (mode == "report") return run_report(argc - 1, argv + 1);
    if (mode == "summary") return run_summary(argc - 1, argv + 1);
    std::fprintf(stderr,
                 "usage: bench_wan_allreduce rank|report|summary ... (--help for each); the "
                 "benchmark itself is bench/bench_wan_allreduce.sh\n");
    return 2;
  } catch (const desloc::Error& e) {
    std::fprintf(stderr, "bench_wan_allreduce %s: %s\n", mode.c_str(), e.message().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_wan_allreduce %s: %s\n", mode.c_str(), e.what());
  }
  return 1;
}
