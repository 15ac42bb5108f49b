// The payload guard's measurement and decision, shared by the virtual and networked averagers
// so that both leave out the same sites for the same inputs.
#include "desloc/sync/payload_guard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"

namespace desloc::sync {

namespace {

// Sum of v^2 in double over eight interleaved partial sums added in a fixed order: the same
// bits on every machine for the same input, and a loop the compiler vectorises. Squares of
// finite floats cannot overflow a double, so a non-finite result means a non-finite input.
double sum_squares(std::span<const float> data) {
  constexpr std::size_t kWays = 8;
  double acc[kWays] = {};
  const std::size_t n = data.size();
  std::size_t i = 0;
  for (; i + kWays <= n; i += kWays)
    for (std::size_t k = 0; k < kWays; ++k) {
      const auto d = static_cast<double>(data[i + k]);
      acc[k] += d * d;
    }
  for (std::size_t k = 0; i < n; ++i, ++k) {
    const auto d = static_cast<double>(data[i]);
    acc[k] += d * d;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

PayloadHealth measure_payload(std::span<const float> data) {
  PayloadHealth h{0.0, sum_squares(data)};
  if (std::isfinite(h.sum_squares)) return h;
  // Rare: count the bad values and sum the finite ones' squares (strictly in order).
  h.sum_squares = 0.0;
  for (const float v : data) {
    if (std::isfinite(v)) {
      h.sum_squares += static_cast<double>(v) * static_cast<double>(v);
    } else {
      h.nonfinite += 1.0;
    }
  }
  return h;
}

std::string PayloadGuard::site_name(int site) const {
  const auto s = static_cast<std::size_t>(site);
  if (site >= 0 && s < site_names.size() && !site_names[s].empty()) return site_names[s];
  return "site " + std::to_string(site);
}

std::vector<Rejection> judge_payloads(std::span<const PayloadHealth> sites, std::size_t elements,
                                      const PayloadGuard& guard, std::int64_t step,
                                      optim::StateKind state) {
  std::vector<Rejection> out;
  if (!guard.enabled) return out;
  std::vector<double> finite_norms;
  for (std::size_t s = 0; s < sites.size(); ++s) {
    if (sites[s].nonfinite > 0.0)
      out.push_back(
          {step, state, static_cast<int>(s),
           fmt::format("{} of {} values non-finite (NaN or Inf)", sites[s].nonfinite, elements)});
    else
      finite_norms.push_back(std::sqrt(sites[s].sum_squares));
  }
  const std::size_t F = finite_norms.size();
  if (F < 3 || guard.outlier_factor <= 0.0 || elements < guard.outlier_min_elements) return out;
  std::vector<double> sorted = finite_norms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[(F - 1) / 2];
  if (!(median > 0.0)) return out;
  const double limit = guard.outlier_factor * median;
  for (std::size_t s = 0; s < sites.size(); ++s) {
    if (sites[s].nonfinite > 0.0) continue;
    const double norm = std::sqrt(sites[s].sum_squares);
    if (norm > limit)
      out.push_back({step, state, static_cast<int>(s),
                     fmt::format("norm {:.4g} is {:.3g}x the median {:.4g} of the {} finite sites "
                                 "(limit {:g}x)",
                                 norm, norm / median, median, F, guard.outlier_factor)});
  }
  std::sort(out.begin(), out.end(),
            [](const Rejection& a, const Rejection& b) { return a.site < b.site; });
  return out;
}

int enforce_rejections(std::span<const Rejection> rejected, int sites, const PayloadGuard& guard,
                       bool log) {
  if (rejected.empty()) return sites;
  const Rejection& first = rejected.front();
  std::string list;
  for (const Rejection& r : rejected)
    list += fmt::format("{}{}: {}", list.empty() ? "" : "; ", guard.site_name(r.site), r.reason);
  const int left = sites - static_cast<int>(rejected.size());
  if (left < 1)
    throw Error(fmt::format(
        "payload guard: step {}, state '{}': every site's contribution was rejected ({}), so "
        "nothing is left to average. A shared bug or a diverged run: restart from the last "
        "checkpoint, or lower the learning rate",
        first.step, optim::to_string(first.state), list));
  if (log)
    log::warn(
        "payload guard: step {}, state '{}': left out of the average ({} of {} sites "
        "kept; the left-out receive their mean): {}",
        first.step, optim::to_string(first.state), left, sites, list);
  return left;
}

}  // namespace desloc::sync
