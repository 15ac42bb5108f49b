// gather_job (job_gather.hpp).
#include "desloc/transport/job_gather.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "desloc/core/error.hpp"

namespace desloc::transport {

std::span<const std::byte> JobBlocks::at(int site, int rank) const {
  std::size_t before = 0;
  for (int s = 0; s < site; ++s) before += static_cast<std::size_t>(ranks.at(std::size_t(s)));
  if (rank < 0 || rank >= ranks.at(static_cast<std::size_t>(site)))
    throw Error("job gather: site " + std::to_string(site) + " has no rank " +
                std::to_string(rank));
  return std::span<const std::byte>(bytes).subspan((before + std::size_t(rank)) * block, block);
}

JobBlocks gather_job(std::span<const std::byte> mine, Collective* site,
                     std::span<Collective* const> rings, OpLabel label) {
  if (rings.empty() || rings.front() == nullptr) throw Error("job gather: no wide-area ring");
  const int R = site != nullptr ? site->size() : 1;
  const std::size_t blk = mine.size();
  std::vector<std::byte> site_blocks(static_cast<std::size_t>(R) * blk);
  if (R > 1) {
    site->set_label(label);
    site->all_gather(mine, site_blocks);
  } else {
    std::copy(mine.begin(), mine.end(), site_blocks.begin());
  }
  const int S = rings.front()->size();
  JobBlocks out;
  out.block = blk;
  if (S == 1) {
    out.ranks = {R};
    out.bytes = std::move(site_blocks);
    return out;
  }
  // The sites' rank counts, then their blocks padded to the most; the same on every ring.
  const auto r32 = static_cast<std::uint32_t>(R);
  std::vector<std::uint32_t> counts(static_cast<std::size_t>(S));
  std::vector<std::byte> all;
  for (Collective* ring : rings) {
    ring->set_label(label);
    ring->all_gather(std::as_bytes(std::span(&r32, 1)), std::as_writable_bytes(std::span(counts)));
  }
  const std::size_t most = *std::max_element(counts.begin(), counts.end());
  site_blocks.resize(most * blk);
  all.resize(static_cast<std::size_t>(S) * most * blk);
  for (Collective* ring : rings) {
    ring->set_label(label);
    ring->all_gather(site_blocks, all);
  }
  for (int s = 0; s < S; ++s) {
    const std::uint32_t n = counts[std::size_t(s)];
    out.ranks.push_back(static_cast<int>(n));
    const auto from = all.begin() + static_cast<std::ptrdiff_t>(std::size_t(s) * most * blk);
    out.bytes.insert(out.bytes.end(), from, from + static_cast<std::ptrdiff_t>(n * blk));
  }
  return out;
}

}  // namespace desloc::transport
