// `desloc profile` / `desloc worker --profile`: measure the job's topology over the same
// control plane and UCX transport that training uses, and write topology.toml.
//
// Every site's rank 0 holds a 2-rank UCX group with every other site's rank 0. One pair at a
// time (the others wait at a wide-area barrier), the lower site measures:
//   latency   ping-pong of 8-byte broadcasts, one way = round trip / 2, p50 and p99 (200, or
//             as many as fit in 3 s, at least 30);
//   bandwidth a broadcast of B bytes followed by a 1-byte acknowledgement, minus the round
//             trip; B doubles from 1 MiB until the faster of two transfers lasts kMinTransfer
//             (at most kMaxBytes), then the median of kBandwidthRepeats; each direction is
//             measured by its sender.
// Then all pairs stream at once (a 2-rank all-reduce on every pair concurrently, each on its
// own thread), for the contended rate. Each site also times training steps of the configured
// model: alone before and after, for the step time, and on the main thread while its pairs
// stream, for the contention. The steal is the streaming threads' own CPU per byte the site
// sent, scaled by the share of a core the compute gets alone (where the communication's CPU
// comes out of the compute, as on a site whose compute fills its cores, a CPU second costs the
// step 1 / share seconds of wall time). Rank 0 of site 0 gathers everything and writes the file,
// and names every link whose bandwidth-delay product its TCP buffers may not cover
// (topology/tcp_window.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>
#include <type_traits>

#include "cluster/session.hpp"
#include "desloc/cluster/cluster.hpp"
#include "desloc/core/cpu_time.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/log.hpp"
#include "desloc/data/loader.hpp"
#include "desloc/model/model.hpp"
#include "desloc/topology/tcp_window.hpp"
#include "desloc/topology/topology.hpp"
#include "desloc/train/memory_estimate.hpp"
#include "desloc/train/trainer.hpp"

namespace desloc::cluster {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPingWarmup = 10;
constexpr int kPings = 200;
constexpr int kMinPings = 30;
constexpr double kPingSeconds = 3.0;  // a 150 ms round trip gets 30 pings, not 200 (60 s)
constexpr double kMinTransfer = 0.5;  // seconds: one bandwidth transfer lasts at least this
constexpr std::size_t kMaxBytes = std::size_t{256} << 20;
constexpr int kBandwidthRepeats = 5;

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * double(v.size() - 1) + 0.5))];
}

// What this site measured about its outgoing link to one peer.
struct LinkRecord {
  double bandwidth_bps = 0, latency_s = 0, latency_p99_s = 0, contended_bps = 0;
};

// Round trips between the pair's two ranks; `sender` starts each one. Returns one-way times.
// After the warm-up the sender chooses how many to time (kPings, or fewer on a long round trip
// so that they take about kPingSeconds, at least kMinPings) and tells the other rank.
std::vector<double> ping(transport::Collective& pair, int sender) {
  std::vector<std::byte> word(8);
  auto round_trip = [&] {
    const auto t0 = Clock::now();
    pair.broadcast(word, sender);
    pair.broadcast(word, 1 - sender);
    return seconds_since(t0);
  };
  double warm = 0;
  for (int i = 0; i < kPingWarmup; ++i) warm = round_trip();
  std::uint64_t count = static_cast<std::uint64_t>(
      std::clamp(kPingSeconds / std::max(warm, 1e-6), double(kMinPings), double(kPings)));
  pair.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&count, 1)), sender);
  std::vector<double> one_way;
  for (std::uint64_t i = 0; i < count; ++i) one_way.push_back(round_trip() / 2);
  return one_way;
}

// Streams from `sender` to the other rank. Both ranks call it; the sender's result counts.
// B doubles from 1 MiB until the faster of two transfers lasts kMinTransfer (or B reaches
// kMaxBytes); then kBandwidthRepeats transfers of that size give the median rate. The sender
// announces each size, so both sides agree on it.
double stream(transport::Collective& pair, int sender, double rtt) {
  std::vector<std::byte> buffer(kMaxBytes);
  std::vector<std::byte> ack(1);
  auto transfer = [&](std::size_t bytes) {
    const auto t0 = Clock::now();
    pair.broadcast(std::span<std::byte>(buffer.data(), bytes), sender);
    pair.broadcast(ack, 1 - sender);
    return seconds_since(t0);
  };
  auto agree = [&](std::uint64_t proposal) {
    pair.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&proposal, 1)), sender);
    return static_cast<std::size_t>(proposal);
  };
  std::size_t bytes = std::size_t{1} << 20;
  for (;;) {
    // The faster of two transfers: the first on a fresh connection is slowed by slow start,
    // and any one may be by a stalled core. Stopping at a small size on such a time left the
    // shaper's token bucket (a burst and one 64 KiB segment, 8 ms of a 100 Mbit link) inside
    // a 1 MiB transfer: 1.06-1.11 x the link's rate on a loaded machine (CI, issue 12).
    const double t = std::min(transfer(bytes), transfer(bytes));
    const bool enough = t >= kMinTransfer || bytes * 2 > kMaxBytes;
    if (agree(enough ? 1 : 0) != 0) break;
    bytes *= 2;
  }
  std::vector<double> rates;
  for (int rep = 0; rep < kBandwidthRepeats; ++rep)
    rates.push_back(double(bytes) / std::max(transfer(bytes) - rtt, 1e-9));
  const double rate = quantile(rates, 0.5);
  if (pair.rank() == sender)
    log::info("profile: {} MiB per transfer: {:.1f} Mbit/s (median of {}, {:.1f} to {:.1f})",
              bytes >> 20, rate * 8 / 1e6, kBandwidthRepeats,
              *std::min_element(rates.begin(), rates.end()) * 8 / 1e6,
              *std::max_element(rates.begin(), rates.end()) * 8 / 1e6);
  return rate;
}

// Training steps of the configured model: wall time and the process's CPU time (every thread,
// the communication's included) of each.
class StepBench {
 public:
  struct Sample {
    double wall_s, cpu_s;
  };
  // At `batch` sequences (the site's own, [[job.site]]).
  StepBench(const train::JobConfig& cfg, int batch)
      : dataset_(train::dataset_of(cfg)),
        model_(model::make_model(cfg.model, {cfg.train.backend, cfg.train.threads, batch, 0})),
        B_(batch),
        T_(cfg.seq_len()),
        loader_(dataset_, B_, T_, cfg.data.seed, 0, 1),
        in_(static_cast<std::size_t>(B_) * T_),
        tgt_(in_.size()) {
    std::vector<float> x(model_->layout().total());
    model::init_params(model_->layout(), cfg.model, cfg.train.seed, x);
    std::copy(x.begin(), x.end(), model_->params().begin());
    model_->params_updated();
  }
  Sample step() {
    loader_.next(in_, tgt_);
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    model_->forward_backward({in_, tgt_, B_, T_});
    return {seconds_since(t0), process_cpu_seconds() - c0};
  }
  // `n` steps after `warmup` untimed ones.
  std::vector<Sample> run(int n, int warmup = 0) {
    for (int i = 0; i < warmup; ++i) step();
    std::vector<Sample> out;
    for (int i = 0; i < n; ++i) out.push_back(step());
    return out;
  }

 private:
  data::DatasetInfo dataset_;
  std::unique_ptr<model::Model> model_;
  int B_, T_;
  data::DataLoader loader_;
  std::vector<std::int32_t> in_, tgt_;
};

// The mean of one field (wall_s or cpu_s) over the samples. For the step time, the mean, not
// the median: where sites share cores a step's wall time swings with the scheduler (63-145 ms
// for a 100 ms step here), and a job's time is the sum of its steps.
double mean(const std::vector<StepBench::Sample>& s, double StepBench::Sample::*field) {
  double sum = 0;
  for (const auto& x : s) sum += x.*field;
  return s.empty() ? 0.0 : sum / double(s.size());
}

// The steps' noise: the standard deviation of ln(wall time) (topology's site.step_jitter; 0 for
// fewer than two samples). On the 3-site bed on 2 cores a step alone swings 0.27-0.30.
double log_sd(const std::vector<StepBench::Sample>& s) {
  if (s.size() < 2) return 0.0;
  double sum = 0, sum2 = 0;
  for (const auto& x : s) {
    const double l = std::log(std::max(x.wall_s, 1e-9));
    sum += l;
    sum2 += l * l;
  }
  const double n = double(s.size()), m = sum / n;
  return std::sqrt(std::max(0.0, (sum2 - n * m * m) / (n - 1)));
}

// The steal (header comment): seconds of compute lost per byte sent while the pairs stream.
constexpr double kLoadSeconds = 3.0;  // the pairs stream at least this long, and 30 steps
constexpr int kStepsBefore = 15, kStepsAfter = 10;  // alone, before and after the streaming
struct Steal {
  double s_per_byte = 0, cpu_alone_s = 0, cpu_loaded_s = 0;
  double thread_cpu_per_byte = 0;  // the streaming threads' own CPU, unscaled
  int steps = 0;
};

// What one site measured, as every site's rank 0 gathers it: trivially copyable, so a row
// travels as its bytes (SiteRow, then one LinkRecord per site of the job, its own left at zero).
struct SiteRow {
  double step_s = 0, noise = 0;  // the compute step (mean) and its sd of ln step time
  int batch = 0;                 // the batch per rank it was timed at
  double memory_bytes = 0;       // what a rank of it may use (train::available_memory)
  topology::TcpBuffers buffers;  // its largest TCP buffers
  Steal steal;
};
static_assert(std::is_trivially_copyable_v<SiteRow> && std::is_trivially_copyable_v<LinkRecord>);

// Every pair of sites in turn (the others wait at a wide-area barrier): latency both ways, then
// each direction's bandwidth, measured by its sender. Returns this site's outgoing links.
std::vector<LinkRecord> measure_pairs(Session& ss) {
  const int S = ss.S, me = ss.site_index;
  std::vector<LinkRecord> out(static_cast<std::size_t>(S));  // this site -> site k
  for (int i = 0; i < S; ++i)
    for (int j = i + 1; j < S; ++j) {
      ss.wan_group()->barrier();
      if (me != i && me != j) continue;
      const int other = me == i ? j : i;
      auto& pair = *ss.pairs[std::size_t(other)];
      log::info("profile: {} <-> {}", ss.sites[std::size_t(i)], ss.sites[std::size_t(j)]);
      // Both directions of the pair: pair rank 0 (site i) sends first, then site j.
      for (int sender = 0; sender < 2; ++sender) {
        const auto one_way = ping(pair, sender);
        const double p50 = quantile(one_way, 0.5);
        const double bw = stream(pair, sender, 2 * p50);
        if (pair.rank() == sender) {
          auto& rec = out[std::size_t(other)];
          rec.latency_s = p50;
          rec.latency_p99_s = quantile(one_way, 0.99);
          rec.bandwidth_bps = bw;
        }
      }
    }
  return out;
}

// All pairs at once: a 2-rank all-reduce moves the buffer once in each direction (each rank
// sends it once). The first timed one gives each link's contended rate (into `out`); the
// pair's lower rank then chooses how many more keep the links busy for kLoadSeconds and 30
// steps, while the main thread trains. Then steps alone again (into `alone`), every site at
// once, so that a drift of the machine between the two measurements does not read as steal.
Steal measure_contention(Session& ss, StepBench& bench, std::vector<StepBench::Sample>& alone,
                         std::vector<LinkRecord>& out) {
  const int S = ss.S, me = ss.site_index;
  const std::size_t bytes = std::size_t{16} << 20;
  std::vector<std::thread> threads;
  std::vector<double> secs(static_cast<std::size_t>(S), 0.0),
      sent(static_cast<std::size_t>(S), 0.0);
  ThreadCpuTally stream_cpu;  // the threads' CPU over their timed all-reduces
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(S));
  std::atomic<int> streaming{0}, finished{0};
  const double load_s = std::max(kLoadSeconds, 30 * mean(alone, &StepBench::Sample::wall_s));
  for (int k = 0; k < S; ++k) {
    if (k == me) continue;
    threads.emplace_back([&, k] {
      bool counted = false;
      try {
        std::vector<float> data(bytes / sizeof(float), 1.0f);
        auto& pair = *ss.pairs[std::size_t(k)];
        pair.all_reduce_sum(data);  // warm-up
        streaming.fetch_add(1);
        counted = true;
        const double cpu0 = thread_cpu_seconds();
        const auto t0 = Clock::now();
        pair.all_reduce_sum(data);
        secs[std::size_t(k)] = seconds_since(t0);
        std::uint64_t more = static_cast<std::uint64_t>(
            std::clamp(std::ceil(load_s / std::max(secs[std::size_t(k)], 1e-6)) - 1, 0.0, 64.0));
        pair.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&more, 1)), 0);
        for (std::uint64_t i = 0; i < more; ++i) pair.all_reduce_sum(data);
        sent[std::size_t(k)] = double(bytes) * double(more + 1);
        stream_cpu.add_seconds(thread_cpu_seconds() - cpu0);
      } catch (...) {
        errors[std::size_t(k)] = std::current_exception();
        if (!counted) streaming.fetch_add(1);
      }
      finished.fetch_add(1);
    });
  }
  // Steps while every pair streams: from the last pair's start to the first one's end.
  while (streaming.load() < S - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::vector<StepBench::Sample> loaded;
  while (finished.load() == 0 && S > 1) loaded.push_back(bench.step());
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (int k = 0; k < S; ++k)
    if (k != me) out[std::size_t(k)].contended_bps = double(bytes) / secs[std::size_t(k)];
  ss.wan_group()->barrier();
  const std::vector<StepBench::Sample> after = bench.run(kStepsAfter);
  alone.insert(alone.end(), after.begin(), after.end());
  const double step_s = mean(alone, &StepBench::Sample::wall_s);
  Steal steal;
  steal.steps = static_cast<int>(loaded.size());
  steal.cpu_alone_s = mean(alone, &StepBench::Sample::cpu_s);
  steal.cpu_loaded_s = mean(loaded, &StepBench::Sample::cpu_s);
  // The threads' own CPU, not the process's CPU per step beyond alone: that difference of
  // two noisy means over some 30 steps read 160 ms per MB on the starved bed where the
  // training runs' communication threads measured 45-48 (codec included).
  double total_sent = 0;
  for (double b : sent) total_sent += b;
  const double share = std::min(1.0, steal.cpu_alone_s / std::max(step_s, 1e-9));
  if (total_sent > 0) steal.thread_cpu_per_byte = stream_cpu.seconds() / total_sent;
  if (share > 0) steal.s_per_byte = steal.thread_cpu_per_byte / share;
  log::info(
      "{}: streaming threads' CPU {:.2f} ms per MB sent; a core share of {:.2f} alone: steal "
      "{:.2f} ms per MB (CPU per step {:.1f} ms alone, {:.1f} ms while every pair streamed, "
      "{} steps)",
      ss.name, steal.thread_cpu_per_byte * 1e9, share, steal.s_per_byte * 1e9,
      steal.cpu_alone_s * 1e3, steal.cpu_loaded_s * 1e3, steal.steps);
  return steal;
}

// Every site's row and outgoing links, at every site's rank 0, in site order.
std::vector<std::pair<SiteRow, std::vector<LinkRecord>>> gather_rows(
    Session& ss, const SiteRow& mine, const std::vector<LinkRecord>& links) {
  const std::size_t S = static_cast<std::size_t>(ss.S);
  const std::size_t row = sizeof(SiteRow) + S * sizeof(LinkRecord);
  std::vector<std::byte> packed(row), all(row * S);
  std::memcpy(packed.data(), &mine, sizeof(SiteRow));
  std::memcpy(packed.data() + sizeof(SiteRow), links.data(), S * sizeof(LinkRecord));
  ss.wan_group()->all_gather(packed, all);
  std::vector<std::pair<SiteRow, std::vector<LinkRecord>>> rows(S);
  for (std::size_t s = 0; s < S; ++s) {
    const std::byte* at = all.data() + row * s;
    std::memcpy(&rows[s].first, at, sizeof(SiteRow));
    rows[s].second.resize(S);
    std::memcpy(rows[s].second.data(), at + sizeof(SiteRow), S * sizeof(LinkRecord));
  }
  return rows;
}

// Site 0's rank 0: the table of every link and site, the TCP warnings, and topology.toml.
void write_topology(const train::JobConfig& cfg, const Session& ss,
                    const std::vector<std::pair<SiteRow, std::vector<LinkRecord>>>& rows,
                    const std::string& out_path) {
  topology::Topology topo;
  topo.meta["source"] = "desloc profile";
  topo.meta["config"] = cfg.source;
  topo.meta["tls"] = cfg.transport.tls;
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  topo.meta["measured_at"] = stamp;
  std::map<std::string, topology::TcpBuffers> site_buffers;
  for (std::size_t s = 0; s < rows.size(); ++s) {
    const auto& [r, links] = rows[s];
    const std::string& name = ss.sites[s];
    topo.sites.push_back(
        {name, r.step_s, r.steal.s_per_byte, r.noise, r.batch, std::max(0.0, r.memory_bytes)});
    site_buffers[name] = r.buffers;
    for (std::size_t k = 0; k < rows.size(); ++k) {
      if (k == s) continue;
      const LinkRecord& l = links[k];
      topology::LinkProfile link{name, ss.sites[k], l.bandwidth_bps, l.latency_s, l.contended_bps};
      topo.links.push_back(link);
      std::printf(
          "%-8s -> %-8s %9.1f Mbit/s  (all pairs at once %9.1f)  latency p50 %.3f ms "
          "p99 %.3f ms\n",
          link.from.c_str(), link.to.c_str(), l.bandwidth_bps * 8 / 1e6, l.contended_bps * 8 / 1e6,
          l.latency_s * 1e3, l.latency_p99_s * 1e3);
    }
    std::printf(
        "%-8s compute step %.1f ms, noise %.3f (sd of ln step time); steal %.2f ms per MB "
        "sent (the streaming threads' CPU %.2f ms per MB, over the compute's share of a core; "
        "CPU per step %.1f ms alone, %.1f ms while every pair streamed)\n",
        name.c_str(), r.step_s * 1e3, r.noise, r.steal.s_per_byte * 1e9,
        r.steal.thread_cpu_per_byte * 1e9, r.steal.cpu_alone_s * 1e3, r.steal.cpu_loaded_s * 1e3);
  }
  for (const auto& [site, b] : site_buffers)
    std::printf("%-8s largest TCP buffers: send %.1f MiB, receive %.1f MiB\n", site.c_str(),
                b.send_max / (1 << 20), b.receive_max / (1 << 20));
  for (const std::string& w : topology::window_warnings(topo, site_buffers))
    log::warn("profile: {}", w);
  for (const std::string& w : topology::slow_start_warnings(topo, site_buffers))
    log::warn("profile: {}", w);
  write_file_atomic(out_path, topology::to_toml(topo));
  std::printf("wrote %s\n", out_path.c_str());
}

}  // namespace

int run_profile_worker(const train::JobConfig& cfg, const WorkerOptions& opts,
                       const std::string& out_path) {
  Session ss = join_job(cfg, opts, /*pair_groups=*/true);
  StepBench bench(cfg, cfg.site_batch(ss.home_site));
  std::vector<StepBench::Sample> alone = bench.run(kStepsBefore, 2);
  // The compute step: the steps alone before the pair measurements, then also those after the
  // streaming.
  log::info("{}: compute step {:.1f} ms", ss.name, mean(alone, &StepBench::Sample::wall_s) * 1e3);
  if (ss.rank != 0) {  // only rank 0 measures links: the others say Bye, so leaving is no loss
    ss.leave();
    ss.client->finish();
    return 0;
  }
  std::vector<LinkRecord> links = measure_pairs(ss);
  ss.wan_group()->barrier();
  SiteRow mine;
  mine.steal = measure_contention(ss, bench, alone, links);
  mine.buffers = topology::read_tcp_buffers();
  mine.step_s = mean(alone, &StepBench::Sample::wall_s);
  mine.noise = log_sd(alone);
  mine.batch = cfg.site_batch(ss.home_site);
  mine.memory_bytes = train::available_memory().bytes;
  log::info("{}: compute step {:.1f} ms, noise {:.3f} (sd of ln step time over {} steps alone)",
            ss.name, mine.step_s * 1e3, mine.noise, alone.size());
  const auto rows = gather_rows(ss, mine, links);
  if (ss.site_index == 0) write_topology(cfg, ss, rows, out_path);
  ss.leave();
  ss.client->finish();
  return 0;
}

}  // namespace desloc::cluster
