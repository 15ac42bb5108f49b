// The site's gradient (DES-LOC Alg. 1, line 1): the mean over the site's R ranks of their
// micro-batch gradients, and the mean of their losses. A networked rank all-reduces over its
// site group (UCX on CPU, NCCL on GPUs: any transport::Collective); in-process the R ranks'
// gradients are summed in the same ring order (transport::ring_sum_reference), so both give
// the same bits.
#pragma once

#include <span>
#include <vector>

#include "desloc/transport/collective.hpp"

namespace desloc::sync {

struct SiteMean {
  float loss = 0.0f;  // the mean of the ranks' micro-batch losses
  bool stop = false;  // some rank of the site asked to stop (networked only)
};

class SiteReducer {
 public:
  // `site_group`: the site's R ranks, or nullptr when this process holds every rank of its
  // site (in-process, or R = 1). It must outlive the reducer.
  explicit SiteReducer(transport::Collective* site_group = nullptr);

  // micro_g: one gradient per rank of the site computed here, or empty when this process
  // computed a single one straight into g. micro_loss: their losses. On return g holds the
  // site's mean gradient.
  SiteMean reduce(std::span<const std::vector<float>> micro_g, std::span<float> g,
                  std::span<const float> micro_loss, bool stop);

 private:
  transport::Collective* site_;
};

}  // namespace desloc::sync
