// The alpha-beta cost of a link.
#include "desloc/topology/link.hpp"

#include <limits>

namespace desloc::topology {

double LinkProfile::transfer_seconds(double bytes) const {
  if (bandwidth_bps <= 0.0) return std::numeric_limits<double>::infinity();
  return latency_s + bytes / bandwidth_bps;
}

}  // namespace desloc::topology
