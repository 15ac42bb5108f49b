// The planner's cost model: the alpha-beta price of a ring or a star all-reduce, the lanes'
// split, and the overhead of periods against compute (planner.hpp's header comment).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "desloc/topology/planner.hpp"

namespace desloc::topology {

double delay_score(std::int64_t kx, std::int64_t tau, double weight) {
  return double(kx) + weight * double(tau);
}

std::string Schedule::describe() const {
  if (kind == "star") return "star at " + order.at(0);
  if (lanes != 2) return fmt::format("ring {} -> {}", fmt::join(order, " -> "), order.at(0));
  return fmt::format(
      "ring {} -> {} and its reverse (2 lanes{})", fmt::join(order, " -> "), order.at(0),
      lane_share == 0.5 ? "" : fmt::format(", {:.0f}% on the ring", 100 * lane_share));
}

double half_life(double beta) { return std::log(0.5) / std::log(beta); }

namespace {
std::vector<std::string> reversed_ring(const std::vector<std::string>& order) {
  std::vector<std::string> reversed{order[0]};
  reversed.insert(reversed.end(), order.rbegin(), order.rend() - 1);
  return reversed;
}
}  // namespace

double site_bytes(double bytes, std::size_t n) {
  return n > 1 ? bytes * 2.0 * double(n - 1) / double(n) : 0.0;
}

double ring_seconds(const Topology& t, const std::vector<std::string>& order, double bytes,
                    int lanes, double lane_share) {
  const std::size_t n = order.size();
  if (n < 2) return 0;
  if (lanes == 2 && n >= 3) {
    // As transport::lane_block splits: ceil(share x count) on the ring.
    const double first = std::ceil(bytes * lane_share);
    return std::max(ring_seconds(t, order, first, 1),
                    ring_seconds(t, reversed_ring(order), std::max(0.0, bytes - first), 1));
  }
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i)
    worst = std::max(
        worst,
        t.link(order[i], order[(i + 1) % n]).transfer_seconds(bytes / static_cast<double>(n)));
  return 2.0 * static_cast<double>(n - 1) * worst;
}

double balanced_lane_share(const Topology& t, const std::vector<std::string>& order, double bytes) {
  if (order.size() < 3) return 0.5;
  const std::vector<std::string> reversed = reversed_ring(order);
  // The ring's time grows with its share and the reverse's falls: bisect for the crossing.
  const auto gap = [&](double s) {
    return ring_seconds(t, order, bytes * s, 1) - ring_seconds(t, reversed, bytes * (1 - s), 1);
  };
  double lo = 0.0, hi = 1.0;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (gap(mid) < 0 ? lo : hi) = mid;
  }
  // A multiple of 0.01, for the config: of the two around the crossing, the faster.
  const double k = std::clamp(std::floor(lo * 100), 1.0, 98.0);
  const double down = k / 100, up = (k + 1) / 100;
  const auto time = [&](double s) { return ring_seconds(t, order, bytes, 2, s); };
  return time(up) <= time(down) ? up : down;
}

double exchange_seconds(const Topology& t, const std::vector<std::string>& order) {
  return ring_seconds(t, order, 64.0 * double(order.size()), 1) / 2;
}

double star_seconds(const Topology& t, const std::string& root, double bytes) {
  double in = 0, out = 0;
  for (const auto& s : t.sites) {
    if (s.name == root) continue;
    in = std::max(in, t.link(s.name, root).transfer_seconds(bytes));
    out = std::max(out, t.link(root, s.name).transfer_seconds(bytes));
  }
  return in + out;
}

double overhead(double sync_s, double step_s, std::int64_t kx, std::int64_t ku, std::int64_t kv,
                bool overlap) {
  // Communication per Kx window against the window's compute.
  const double window = static_cast<double>(kx) * step_s;
  const double comm = sync_s * (1.0 + double(kx) / double(ku) + double(kx) / double(kv));
  if (!overlap) return comm / window;
  return std::max(0.0, comm - window) / window;
}

}  // namespace desloc::topology
