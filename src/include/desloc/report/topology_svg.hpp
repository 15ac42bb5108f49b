// Pictures of a topology (self-contained SVG, as svg_chart.hpp): the sites on a circle with
// every link labelled by its measured bandwidth and the chosen ring drawn over them, and the
// bandwidth matrix as a heatmap.
#pragma once

#include <string>
#include <vector>

#include "desloc/topology/topology.hpp"

namespace desloc::report {

// `ring` (site names in ring order; empty = none) is drawn as arrows over the links.
std::string svg_topology_diagram(const topology::Topology& t, const std::vector<std::string>& ring,
                                 const std::string& title);

// Rows are senders, columns receivers; cells coloured on a log scale of Mbit/s and labelled.
std::string svg_bandwidth_heatmap(const topology::Topology& t, const std::string& title);

}  // namespace desloc::report
