// The synthetic topologies the scale benchmarks share (bench_simulate, bench_plan_scale):
// `regions` regions of `per_region` sites each, 100 Gbit and 0.5 ms inside a region, 1 to
// 25 Gbit (by the pair of regions) and 20 ms between regions, every site's step `step_s`.
#pragma once

#include <cstddef>
#include <string>

#include "desloc/topology/topology.hpp"

namespace desloc::bench {

inline topology::Topology grouped_topology(int regions, int per_region, double step_s) {
  topology::Topology t;
  t.source = "synthetic";
  const int n = regions * per_region;
  for (int s = 0; s < n; ++s)
    t.sites.push_back(
        {"r" + std::to_string(s / per_region) + "s" + std::to_string(s % per_region), step_s});
  t.links.reserve(static_cast<std::size_t>(n) * static_cast<std::size_t>(n - 1));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      const int ra = a / per_region, rb = b / per_region;
      topology::LinkProfile l;
      l.from = t.sites[std::size_t(a)].name;
      l.to = t.sites[std::size_t(b)].name;
      const double mbit = ra == rb ? 100000.0 : 1000.0 + 1000.0 * ((ra * 7 + rb) % 25);
      l.bandwidth_bps = mbit * 1e6 / 8;
      l.latency_s = ra == rb ? 0.0005 : 0.020;
      t.links.push_back(l);
    }
  return t;
}

}  // namespace desloc::bench
