// The intra-site gradient mean (site_reducer.hpp).
#include "desloc/sync/site_reducer.hpp"

#include <array>

#include "desloc/core/error.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {
namespace {

// What a ring all-reduce over the site's ranks followed by "/ R" leaves, bit for bit the
// networked ranks' result.
void ring_mean(std::span<const std::span<const float>> parts, std::span<float> out) {
  transport::ring_sum_reference(parts, out);
  const auto r = static_cast<float>(parts.size());
  for (float& x : out) x /= r;
}

}  // namespace

SiteReducer::SiteReducer(transport::Collective* site_group)
    : site_(site_group != nullptr && site_group->size() > 1 ? site_group : nullptr) {}

SiteMean SiteReducer::reduce(std::span<const std::vector<float>> micro_g, std::span<float> g,
                             std::span<const float> micro_loss, bool stop) {
  if (micro_loss.empty()) throw Error("site reducer: no micro-batch losses");
  SiteMean out{micro_loss[0], stop};
  if (!micro_g.empty()) {  // this process holds the site's R ranks
    std::vector<std::span<const float>> parts(micro_g.begin(), micro_g.end());
    ring_mean(parts, g);
    std::vector<std::span<const float>> losses;
    for (const float& l : micro_loss) losses.emplace_back(&l, 1);
    ring_mean(losses, std::span<float>(&out.loss, 1));
  } else if (site_ != nullptr) {
    site_->all_reduce_sum(g);
    const auto r = static_cast<float>(site_->size());
    for (float& x : g) x /= r;
    // The loss and this rank's stop request ride one small all-reduce: element 0 sums in
    // rank order, as ring_mean's does.
    std::array<float, 2> small{micro_loss[0], stop ? 1.0f : 0.0f};
    site_->all_reduce_sum(small);
    out.loss = small[0] / r;
    out.stop = small[1] > 0.0f;
  }
  return out;
}

}  // namespace desloc::sync
