// A measured directed link between two sites, in the units the planner uses.
#pragma once

#include <string>

namespace desloc::topology {

struct LinkProfile {
  std::string from;            // site name
  std::string to;              // site name
  double bandwidth_bps = 0.0;  // payload bytes per second, as measured
  double latency_s = 0.0;      // one-way small-message latency, seconds
  // Payload bytes per second while every pair of sites streams at once; 0 = not measured.
  double contended_bps = 0.0;

  // Predicted time to move `bytes` over this link: latency + bytes / bandwidth (alpha-beta).
  double transfer_seconds(double bytes) const;
};

}  // namespace desloc::topology
