// Proposing regions from a bandwidth matrix (regions.hpp).
#include "desloc/topology/regions.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>

namespace desloc::topology {
namespace {

// Candidate thresholds tried: the largest gaps between consecutive pair capacities. Beyond a
// few dozen the gaps are small and the proposal would not change; this keeps 1024 sites fast.
constexpr std::size_t kMaxCandidates = 32;

struct Pair {
  std::size_t a, b;
  double bps;
};

class UnionFind {
 public:
  explicit UnionFind(std::size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0); }
  std::size_t find(std::size_t x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void join(std::size_t a, std::size_t b) { parent_[find(a)] = find(b); }

 private:
  std::vector<std::size_t> parent_;
};

std::string mbit(double bps) { return fmt::format("{:.0f} Mbit/s", bps * 8 / 1e6); }

}  // namespace

RegionProposal propose_regions(const Topology& t) {
  RegionProposal best;
  const std::vector<std::string> names = t.site_names();
  const std::size_t n = names.size();
  // A dense matrix by site index: a map keyed by name pairs costs a second at 1024 sites.
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t s = 0; s < n; ++s) index.emplace(names[s], s);
  std::vector<double> bw(n * n, 0.0);
  for (const LinkProfile& l : t.links) bw[index.at(l.from) * n + index.at(l.to)] = l.bandwidth_bps;
  std::vector<Pair> pairs;
  pairs.reserve(n * (n - 1) / 2);
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = a + 1; b < n; ++b)
      pairs.push_back({a, b, std::min(bw[a * n + b], bw[b * n + a])});
  std::sort(pairs.begin(), pairs.end(), [](const Pair& x, const Pair& y) { return x.bps > y.bps; });

  // Thresholds at the largest gaps: keep the pairs [0, i] with capacity >= pairs[i].bps.
  std::vector<std::size_t> cuts;
  for (std::size_t i = 0; i + 1 < pairs.size(); ++i)
    if (pairs[i].bps > pairs[i + 1].bps) cuts.push_back(i);
  std::sort(cuts.begin(), cuts.end(), [&](std::size_t x, std::size_t y) {
    return pairs[x].bps / pairs[x + 1].bps > pairs[y].bps / pairs[y + 1].bps;
  });
  if (cuts.size() > kMaxCandidates) cuts.resize(kMaxCandidates);

  double best_gap = 0.0;
  for (const std::size_t cut : cuts) {
    UnionFind groups(n);
    for (std::size_t i = 0; i <= cut; ++i) groups.join(pairs[i].a, pairs[i].b);
    double inside = -1.0, between = 0.0;
    const Pair* slow_in = nullptr;
    const Pair* fast_out = nullptr;
    std::vector<std::size_t> root(n);
    for (std::size_t s = 0; s < n; ++s) root[s] = groups.find(s);
    for (const Pair& p : pairs) {
      if (root[p.a] == root[p.b]) {
        if (inside < 0 || p.bps < inside) inside = p.bps, slow_in = &p;
      } else if (p.bps > between) {
        between = p.bps, fast_out = &p;
      }
    }
    std::map<std::size_t, std::vector<std::string>> by_root;
    for (std::size_t s = 0; s < n; ++s) by_root[root[s]].push_back(names[s]);
    const bool shaped = by_root.size() >= 2 && inside > 0 &&
                        std::any_of(by_root.begin(), by_root.end(),
                                    [](const auto& g) { return g.second.size() >= 2; });
    if (!shaped || between <= 0) continue;
    const double gap = inside / between;
    if (gap <= best_gap) continue;
    best_gap = gap;
    best.regions.clear();
    for (auto& [root, members] : by_root) best.regions.push_back(members);
    std::sort(best.regions.begin(), best.regions.end(), [&](const auto& x, const auto& y) {
      const auto pos = [&](const std::string& s) {
        return std::find(names.begin(), names.end(), s) - names.begin();
      };
      return pos(x.front()) < pos(y.front());
    });
    best.inside_min_bps = inside;
    best.between_max_bps = between;
    best.slowest_inside = names[slow_in->a] + "-" + names[slow_in->b];
    best.fastest_between = names[fast_out->a] + "-" + names[fast_out->b];
  }

  if (best.regions.empty() || best_gap < kRegionGap) {
    best.explanation.push_back(
        best.regions.empty()
            ? fmt::format("regions: none proposed: no grouping of the {} sites into two or more "
                          "regions (one of two sites or more) exists by their link capacities",
                          n)
            : fmt::format("regions: none proposed: the best grouping ({} regions) has links "
                          "inside its regions only {:.1f}x faster than between them (slowest "
                          "inside {} at {}, fastest between {} at {}); a region needs {:.0f}x",
                          best.regions.size(), best_gap, best.slowest_inside,
                          mbit(best.inside_min_bps), best.fastest_between,
                          mbit(best.between_max_bps), kRegionGap));
    best.regions.clear();
    return best;
  }
  best.explanation.push_back(fmt::format(
      "regions: proposed {} regions: {}. Every pair inside a region has at least {} (slowest "
      "{}); every pair between regions at most {} (fastest {}): {:.1f}x apart (a region needs "
      "{:.0f}x). Two-level DES-LOC would average often inside them and rarely across them",
      best.regions.size(), describe_regions(best.regions), mbit(best.inside_min_bps),
      best.slowest_inside, mbit(best.between_max_bps), best.fastest_between, best_gap, kRegionGap));
  return best;
}

std::string describe_regions(const std::vector<std::vector<std::string>>& regions) {
  std::vector<std::string> listed;
  for (const auto& r : regions) listed.push_back(fmt::format("[{}]", fmt::join(r, ", ")));
  return fmt::format("{}", fmt::join(listed, " "));
}

}  // namespace desloc::topology
