// The paper's toy problem (arXiv 2505.22549, Sec. 3, Fig. 2a): M virtual sites minimise the
// Rosenbrock function from noisy gradients under one SyncPolicy. Small enough to run the whole
// family of sync methods in seconds, and deterministic to the bit for a given seed.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/sync_policy.hpp"

namespace desloc::sync {

// f(x1, x2) = (1 - x1)^2 + 100 (x2 - x1^2)^2; its only minimum is f(1, 1) = 0.
double rosenbrock(double x1, double x2);
std::array<double, 2> rosenbrock_gradient(double x1, double x2);

// The per-site Gaussian gradient noise: site w's stream depends only on (seed, w), and the
// normal deviates come from a hand-written Box-Muller over splitmix64, so runs are identical
// across standard libraries (std::normal_distribution is implementation-defined).
class NoiseStream {
 public:
  NoiseStream(std::uint64_t seed, std::uint64_t site);
  // Two independent N(0, 1) deviates (one Box-Muller pair: one per coordinate of the toy).
  std::array<double, 2> normal_pair();

 private:
  std::uint64_t next_u64();
  std::uint64_t state_;
};

struct ToyProblemConfig {
  SyncConfig sync;                          // method, sites (M) and periods; outer must be "none"
  optim::OptimizerConfig optimizer;         // the local optimizer of every site; no weight decay
                                            // is applied (plain-vector optimizer)
  float lr = 1e-3f;                         // constant learning rate
  std::array<float, 2> start{-1.5f, 2.0f};  // every site starts here with u = v = 0
  float sigma = 1.5f;  // std of the IID Gaussian noise added to each gradient coordinate
  std::int64_t steps = 1000;
  std::uint64_t seed = 0;
  // What "favg_reset" restarts after each parameter average: u and v are always zeroed; with
  // reset_step_count the bias-correction step count restarts too (a fresh torch.optim.Adam).
  bool reset_step_count = true;
  // Each site's weight in the averages (Averager::set_weights: sites of unequal tokens per
  // step); empty = alike. The sites' mean in the result is then the weighted one.
  std::vector<double> weights;
};

struct ToyProblemResult {
  // distance[t] = || mean_m x_m - (1, 1) ||_2 after step t (distance[0] is the start point),
  // size steps + 1. It is measured at the sites' mean, the point a parameter average would
  // produce, so methods are compared at the same kind of point whether or not step t synced.
  std::vector<double> distance;
  // site_distance[t] = mean over m of || x_m - (1, 1) ||_2 after step t, size steps + 1: how
  // far the replicas themselves are between syncs (what a site that stopped at t would hold).
  std::vector<double> site_distance;
  std::array<double, 2> final_mean_x{};  // mean over sites after the last step
  double final_loss = 0.0;               // f(final_mean_x)
  Traffic traffic;                       // site 0's bytes (every site moves the same)
};

// Runs cfg.steps steps of the DES-LOC rule (DESIGN.md, "The algorithm") for all sites:
//   1. g_m = grad f(x_m) + sigma * noise_m, at the site's un-averaged x;
//   2. every state due at t (policy.at(t)) is replaced by its mean over the sites
//      (VirtualAverager); for favg_reset u and v are then zeroed;
//   3. the local optimizer update of each site with its own g_m.
// Throws ConfigError for a bad config (sites < 1, steps < 0, sigma < 0, an outer optimizer).
ToyProblemResult run_rosenbrock(const ToyProblemConfig& cfg);

}  // namespace desloc::sync
