// Regions: groups of sites whose links to one another are much faster than the links between
// groups (issue 15), proposed from a measured topology's bandwidth matrix. Two-level DES-LOC
// would average often inside a region and rarely across regions; the proposal is the grouping
// it would use.
#pragma once

#include <string>
#include <vector>

#include "desloc/topology/topology.hpp"

namespace desloc::topology {

// Links inside a proposed region must all be at least this many times faster than every link
// between two regions.
inline constexpr double kRegionGap = 4.0;

struct RegionProposal {
  // The regions, each in topology order, ordered by their first site; empty when none is
  // proposed (fewer than kRegionGap between any grouping's inside and outside links, or no
  // grouping with at least two regions and a region of two sites).
  std::vector<std::vector<std::string>> regions;
  double inside_min_bps = 0.0;                  // the slowest pair inside a region (bytes/s)
  double between_max_bps = 0.0;                 // the fastest pair between regions (bytes/s)
  std::string slowest_inside, fastest_between;  // those pairs, "A-B"
  std::vector<std::string> explanation;         // the reasoning, one line each
};

// A pair's capacity is the slower of its two directions. Candidate thresholds are the largest
// gaps in the sorted pair capacities; each splits the sites into the connected groups of the
// pairs at or above it, and counts only if every pair inside a group is at or above it (no
// chaining through a fast intermediate). The grouping with the largest gap between its slowest
// inside pair and its fastest between pair wins if that gap is at least kRegionGap.
RegionProposal propose_regions(const Topology& t);

// Regions as messages show them: "[A, B] [C, D]".
std::string describe_regions(const std::vector<std::vector<std::string>>& regions);

}  // namespace desloc::topology
