// libFuzzer target for the topology loader (topology/src/topology.cpp): any text must either
// parse into a Topology whose every ordered site pair has a link, or end in a ConfigError.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "desloc/core/error.hpp"
#include "desloc/topology/topology.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  desloc::topology::Topology t;
  try {
    t = desloc::topology::parse_topology(text, "fuzz-topology.toml");
  } catch (const desloc::ConfigError&) {
    return 0;
  }
  // What the planner and simulator rely on: a link for every ordered pair, with a usable
  // bandwidth, so that transfer times are finite.
  for (const auto& a : t.sites) {
    for (const auto& b : t.sites) {
      if (a.name == b.name) continue;
      const auto& link = t.link(a.name, b.name);
      if (!(link.bandwidth_bps > 0) || !std::isfinite(link.latency_s))
        desloc::fuzz::oracle_failure("fuzz_topology",
                                     "accepted link " + a.name + " -> " + b.name +
                                         " with a bandwidth or latency the planner cannot use");
    }
  }
  (void)desloc::topology::to_toml(t);
  return 0;
}
