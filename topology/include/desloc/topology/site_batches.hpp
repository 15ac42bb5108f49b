// Sites of unequal speed (issue 38): the batch per rank of each site that makes the sites'
// steps take the same time, so that no site waits for a slower one at every average, while the
// job trains on as many sequences per step as configured.
//
// A site's step is taken as linear in its batch: a rank of site s that took step_s seconds at
// the batch its profile timed (SiteProfile::batch) trains at v_s = batch / step_s sequences a
// second. The job's N = sum_s ranks_s * batch_s sequences a step are shared in proportion to the
// sites' speed, ranks_s * v_s, so every site steps in N / sum_s ranks_s v_s seconds. Each batch
// is then a whole number of sequences, at least 1, and at most what the site's memory holds
// (SiteProfile::memory_bytes against the caller's estimate); what a capped or floored site
// cannot take goes to the others, in proportion again, and the sequences the rounding leaves
// go one rank-batch at a time to the site whose step stays shortest.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "desloc/topology/topology.hpp"

namespace desloc::topology {

struct SiteBatchRequest {
  std::vector<std::string> sites;  // the job's sites, in ring order
  std::vector<int> ranks;          // each site's ranks
  // Each site's batch per rank, as configured; also the batch a topology site that recorded
  // none (SiteProfile::batch = 0) was timed at.
  std::vector<int> batch;
  // The bytes one rank needs at a batch (the config's memory estimate); empty: no cap.
  std::function<double(int batch)> memory_at;
};

struct SiteBatchPlan {
  std::vector<int> ranks;                 // each site's ranks (the request's)
  std::vector<int> batch;                 // each site's balanced batch per rank
  std::vector<double> configured_step_s;  // each site's predicted step at the configured batch
  std::vector<double> step_s;             // ... and at the balanced batch
  std::vector<int> memory_cap;            // each site's largest batch that fits (0: no cap)
  double configured_job_step_s = 0;       // the slowest site's step, as configured
  double job_step_s = 0;                  // ... balanced
  long sequences = 0;                     // per step: configured
  long balanced_sequences = 0;            // ... and balanced (within one rank-batch of it)
  // Set when a site stays slower than the others at its smallest batch (or its memory leaves
  // too much to the others): its name.
  std::string pace_setter;
  std::vector<std::string> explanation;  // the table, and why
};

// ConfigError when a site is missing from the topology, or the request's vectors differ in size.
SiteBatchPlan balance_site_batches(const Topology& t, const SiteBatchRequest& req);

}  // namespace desloc::topology
