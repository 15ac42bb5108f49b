// Question: what does a site with fewer ranks cost the wide-area average of sites whose rank
// counts differ? The shard map (src/sync/shard_map.cpp) cuts each state into segments, one
// ring per segment joining its owner in every site; a site of one rank owns every segment and
// runs their rings one after the other, where a site of four runs four rings at once, one a
// rank. Two sites as threads over UCX loopback (tcp), each rank's CollectiveAverager averaging a
// state of --mb MB: the wall time of one average per site (median [min-max] over the repeats
// of its rank 0's), beside the same state between two sites of four ranks, and each rank's
// wide-area bytes.
//
// Validation first: every rank's result equals the VirtualAverager over the same map, bit for
// bit. On one machine the rings share its cores and the loopback, so the ratio is the CPU and
// copying a single rank does alone; across datacenters the site's one NIC carries the whole
// state, which is the same ratio again in bytes per rank (printed).
//
//   bench_shard_map [--mb 64] [--repeats 7] [--warmup 2]
#include <fmt/format.h>

#include <barrier>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "desloc/sync/averager.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/sync/shard_map.hpp"
#include "desloc/transport/ucx_collective.hpp"
#include "harness.hpp"

namespace {
using namespace desloc;
using bench::BenchError;

float value(int site, std::size_t i) {
  const auto h = static_cast<std::uint32_t>((i * 2654435761u) ^ (unsigned(site + 1) * 40503u));
  return static_cast<float>(h % 100003) * 1e-5f - 0.5f;
}

struct Layout {
  std::vector<int> ranks;  // per site
  // Per site: its rank 0's milliseconds per average, and its ranks' wide-area bytes (the most).
  std::vector<std::vector<double>> ms;
  std::vector<std::uint64_t> wire;
};

// Runs `repeats` + `warmup` averages of an n-float state on sites of layout.ranks ranks, all
// ranks starting each together; checks the first against the VirtualAverager bit for bit.
void run(Layout& layout, std::size_t n, int warmup, int repeats) {
  const int S = static_cast<int>(layout.ranks.size());
  const sync::ShardMap map(layout.ranks);
  std::vector<std::vector<float>> expect(static_cast<std::size_t>(S), std::vector<float>(n));
  for (int s = 0; s < S; ++s)
    for (std::size_t i = 0; i < n; ++i) expect[std::size_t(s)][i] = value(s, i);
  {
    std::vector<std::span<float>> views(expect.begin(), expect.end());
    sync::VirtualAverager ref(S, sync::SumOrder::kRing, map, 1, 0.5);
    ref.average(optim::StateKind::kX, views);
  }
  int world = 0;
  for (const int r : layout.ranks) world += r;
  std::vector<transport::InMemoryAddressBook> site_books(static_cast<std::size_t>(S));
  std::vector<transport::InMemoryAddressBook> ring_books(static_cast<std::size_t>(map.segments()));
  std::barrier together(world);
  layout.ms.assign(static_cast<std::size_t>(S), {});
  layout.wire.assign(static_cast<std::size_t>(S), 0);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::string> mismatch(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  int index = 0;
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < layout.ranks[std::size_t(s)]; ++r, ++index)
      threads.emplace_back([&, s, r, index] {
        const int R = layout.ranks[std::size_t(s)];
        try {
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          transport::CollectiveOptions o;
          o.deadline = std::chrono::seconds(120);
          auto site_port = R > 1 ? transport::open_ucx_port() : nullptr;
          if (R > 1) site_books[std::size_t(s)].publish(r, site_port->address());
          const sync::ShardMap::Segments own = map.segments_of(R, r);
          std::vector<std::unique_ptr<transport::UcxPort>> ports;
          for (int j = own.first; j < own.last; ++j) {
            ports.push_back(transport::open_ucx_port());
            ring_books[std::size_t(j)].publish(s, ports.back()->address());
          }
          std::unique_ptr<transport::Collective> site;
          if (R > 1)
            site = transport::connect_ucx_collective(
                std::move(site_port), r, R,
                site_books[std::size_t(s)].lookup((r + 1) % R, deadline), o);
          std::vector<std::unique_ptr<transport::Collective>> rings;
          std::vector<sync::WanRing> views;
          for (int j = own.first; j < own.last; ++j) {
            rings.push_back(transport::connect_ucx_collective(
                std::move(ports[std::size_t(j - own.first)]), s, S,
                ring_books[std::size_t(j)].lookup((s + 1) % S, deadline), o));
            views.push_back({j, rings.back().get(), nullptr});
          }
          sync::CollectiveAverager avg(views, map, site.get(), 0.5);
          sync::PayloadGuard off;
          off.enabled = false;
          avg.set_payload_guard(off);
          std::vector<float> mine(n);
          for (int k = 0; k < warmup + repeats; ++k) {
            for (std::size_t i = 0; i < n; ++i) mine[i] = value(s, i);
            std::span<float> one(mine);
            together.arrive_and_wait();
            const double t0 = bench::now_s();
            avg.average(optim::StateKind::kX, std::span<const std::span<float>>(&one, 1));
            const double ms = 1e3 * (bench::now_s() - t0);
            if (k == 0 &&
                std::memcmp(mine.data(), expect[std::size_t(s)].data(), n * sizeof(float)) != 0)
              mismatch[std::size_t(index)] = fmt::format("site {} rank {}", s, r);
            if (k >= warmup && r == 0) layout.ms[std::size_t(s)].push_back(ms);
          }
          together.arrive_and_wait();
          const std::uint64_t wire =
              avg.traffic(0).wire[static_cast<std::size_t>(optim::StateKind::kX)];
          together.arrive_and_wait();  // no rank leaves while a ring still runs
          if (r == 0) layout.wire[std::size_t(s)] = wire / std::uint64_t(warmup + repeats);
        } catch (...) {
          errors[std::size_t(index)] = std::current_exception();
          together.arrive_and_drop();
        }
      });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (const auto& m : mismatch)
    if (!m.empty()) throw BenchError("the networked average differs from the reference at " + m);
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 64;
  int repeats = 7, warmup = 2;
  bench::Flags flags("bench_shard_map [--mb 64] [--repeats 7] [--warmup 2]");
  flags.add("--mb", mb).add("--repeats", repeats).add("--warmup", warmup);
  try {
    flags.parse(argc, argv);
    const auto n = static_cast<std::size_t>(mb * 1024 * 1024 / sizeof(float));
    std::vector<Layout> layouts{
        {{4, 4}, {}, {}}, {{1, 4}, {}, {}}, {{2, 4}, {}, {}}, {{1, 1}, {}, {}}};
    for (Layout& l : layouts) run(l, n, warmup, repeats);
    std::printf(
        "bench_shard_map: one average of a %.0f MB state between two sites over UCX "
        "loopback; load %s\n",
        mb, bench::load_average().c_str());
    std::printf("validated: every rank's mean equals the VirtualAverager's bit for bit\n\n");
    const double alike = bench::summarize(layouts[0].ms[0]).median;
    bench::Table t(
        {"ranks (A, B)", "site", "ms per average", "x the 4+4 site's", "wide-area MB per rank"});
    for (const Layout& l : layouts)
      for (std::size_t s = 0; s < l.ranks.size(); ++s) {
        const bench::Stats st = bench::summarize(l.ms[s]);
        t.add({fmt::format("{}, {}", l.ranks[0], l.ranks[1]),
               fmt::format("{} ({} rank{})", s == 0 ? "A" : "B", l.ranks[s],
                           l.ranks[s] == 1 ? "" : "s"),
               bench::fmt_stats(st), bench::fmt(st.median / alike),
               bench::fmt(l.wire[s] / 1e6, 1)});
      }
    t.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_shard_map: %s\n", e.what());
    return 1;
  }
  return 0;
}
