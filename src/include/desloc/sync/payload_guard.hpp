// The payload guard: before a state is averaged, every site's contribution is judged from a
// two-number summary, and a site whose payload is non-finite or whose norm is absurdly far
// above the others' is left out of that average (it then receives the others' mean and heals).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "desloc/optim/optimizer.hpp"

namespace desloc::sync {

// One site's contribution to one average, summarised. Sums are taken in a fixed order, so the
// same payload cut into the same shards gives the same bits in every averager.
struct PayloadHealth {
  double nonfinite = 0.0;    // elements that are NaN or +-Inf (exact up to 2^53)
  double sum_squares = 0.0;  // sum of x^2 over the finite elements, in double (cannot overflow)

  PayloadHealth& operator+=(const PayloadHealth& o) {
    nonfinite += o.nonfinite;
    sum_squares += o.sum_squares;
    return *this;
  }
};

// The summary of one contiguous piece of a payload (a shard). Combine the pieces of a site
// with += in shard order.
PayloadHealth measure_payload(std::span<const float> data);

struct PayloadGuard {
  // Off: nothing is measured or exchanged and every average is the plain mean.
  bool enabled = true;
  // With at least 3 finite sites, a site whose norm exceeds outlier_factor times the lower
  // median of the finite sites' norms is rejected; 0 turns the norm test off. Sites of one job
  // differ by a few percent (DES-LOC drift, minibatch noise); a bug or a poisoned site is off
  // by orders of magnitude.
  double outlier_factor = 10.0;
  // The norm test needs vectors long enough for a healthy norm to be a stable statistic: a
  // 2-parameter toy's noisy gradients legitimately differ by 10x between sites.
  std::size_t outlier_min_elements = 1024;
  // Names for messages, indexed by site (ring position); a site without one is "site k".
  std::vector<std::string> site_names;

  std::string site_name(int site) const;
};

// One site left out of one average.
struct Rejection {
  std::int64_t step = -1;  // Averager::begin_step's t; -1 before the first step
  optim::StateKind state = optim::StateKind::kX;
  int site = -1;       // ring position (virtual site index for the VirtualAverager)
  std::string reason;  // "3 of 4096 values non-finite ...", "norm 1.2e+04 is 1e+03x the median ..."
};

// The sites to leave out of one average of `elements`-long buffers, given every site's
// summary (indexed by site). A pure function of its arguments: every rank that holds the same
// summaries takes the same decision.
//   1. A site with any non-finite value is rejected.
//   2. Among the remaining F sites, with F >= 3, elements >= outlier_min_elements and
//      outlier_factor > 0: let m be the lower median of their norms (the (F-1)/2-th smallest),
//      and reject a site whose norm > outlier_factor * m (m = 0: no norm test). The lower
//      median is a healthy norm while fewer than half the finite sites are inflated (exactly
//      half for even F). Only the upper side is tested: a small contribution moves the mean by
//      at most the others' scale / S, an inflated one without bound.
//   With 2 sites an inflated norm cannot be attributed to either side, so only rule 1 applies.
std::vector<Rejection> judge_payloads(std::span<const PayloadHealth> sites, std::size_t elements,
                                      const PayloadGuard& guard, std::int64_t step,
                                      optim::StateKind state);

// Logs one warning line naming the rejected sites (when `log` is set) and throws Error
// when no site is left (`sites` in all). Returns the number of sites still averaged.
int enforce_rejections(std::span<const Rejection> rejected, int sites, const PayloadGuard& guard,
                       bool log);

}  // namespace desloc::sync
