// Every rank's block, gathered on every rank of a job whose sites may have unequal rank counts:
// an all-gather inside the site, then one over each of the rank's wide-area rings (a rank of
// several segments is in several rings; each ring's other ranks wait for it there, and every
// ring carries the same sites' blocks). The sites first swap their rank counts (4 bytes each),
// and each site's blocks travel padded to the largest count.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "desloc/transport/collective.hpp"

namespace desloc::transport {

struct JobBlocks {
  std::vector<int> ranks;        // per site, in ring order
  std::vector<std::byte> bytes;  // sum(ranks) blocks, site by site in ring order, rank order inside
  std::size_t block = 0;         // the bytes of one block
  // Block `rank` of site position `site`.
  std::span<const std::byte> at(int site, int rank) const;
};

// `mine` has the same size on every rank; `site` is the site's group (null for one rank);
// `rings` are the rank's wide-area rings in segment order (at least one; each of the same
// sites in the same order), `label` their operations' label (its shard field is ignored).
JobBlocks gather_job(std::span<const std::byte> mine, Collective* site,
                     std::span<Collective* const> rings, OpLabel label);

}  // namespace desloc::transport
