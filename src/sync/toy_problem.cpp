// The Rosenbrock toy problem of arXiv 2505.22549 (Fig. 2a) under any SyncPolicy.
#include "desloc/sync/toy_problem.hpp"

#include "desloc/sync/synced_step.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <span>
#include <string>

#include "desloc/core/error.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace desloc::sync {
namespace {

std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The toy has 2 floats per site: OpenMP regions inside the optimizer and the averager cost
// far more than they save (and on a loaded machine a barrier can cost a time slice), so the
// run is single-threaded. The results do not depend on the thread count either way.
class SingleThreadScope {
 public:
#ifdef _OPENMP
  SingleThreadScope() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreadScope() { omp_set_num_threads(saved_); }

 private:
  int saved_;
#endif
};

void validate(const ToyProblemConfig& cfg) {
  const SyncConfig& s = cfg.sync;
  if (s.sites < 1)
    throw ConfigError("toy problem: sync.workers must be >= 1, got " + std::to_string(s.sites));
  if (cfg.steps < 0)
    throw ConfigError("toy problem: steps must be >= 0, got " + std::to_string(cfg.steps));
  if (!(cfg.sigma >= 0.0f))
    throw ConfigError("toy problem: sigma must be >= 0, got " + std::to_string(cfg.sigma));
  if (!cfg.weights.empty() && cfg.weights.size() != static_cast<std::size_t>(s.sites))
    throw ConfigError("toy problem: " + std::to_string(cfg.weights.size()) + " weights for " +
                      std::to_string(s.sites) + " sites");
  for (const double w : cfg.weights)
    if (!(w > 0.0 && std::isfinite(w)))
      throw ConfigError("toy problem: a site's weight must be positive, got " + std::to_string(w));
  if (s.outer != OuterStep::kNone)
    throw ConfigError("toy problem: sync.outer = \"" + std::string(to_string(s.outer)) +
                      "\" is not supported here; set it to \"none\"");
  // Every method but ddp has a parameter period (none ignores it).
  if (s.averages_params() && s.kx <= 0)
    throw ConfigError("toy problem: sync.kx must be positive, got " + std::to_string(s.kx));
  cfg.optimizer.validate();
}

}  // namespace

double rosenbrock(double x1, double x2) {
  const double a = 1.0 - x1;
  const double b = x2 - x1 * x1;
  return a * a + 100.0 * b * b;
}

std::array<double, 2> rosenbrock_gradient(double x1, double x2) {
  const double b = x2 - x1 * x1;
  return {-2.0 * (1.0 - x1) - 400.0 * x1 * b, 200.0 * b};
}

NoiseStream::NoiseStream(std::uint64_t seed, std::uint64_t site)
    : state_(splitmix64_mix(seed ^ splitmix64_mix(site + 0x632be59bd9b4e019ULL))) {}

std::uint64_t NoiseStream::next_u64() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return splitmix64_mix(state_);
}

std::array<double, 2> NoiseStream::normal_pair() {
  // Box-Muller: u1 in (0, 1] keeps the log finite, u2 in [0, 1); 53-bit uniforms.
  constexpr double kInv53 = 1.0 / 9007199254740992.0;
  const double u1 = 1.0 - static_cast<double>(next_u64() >> 11) * kInv53;
  const double u2 = static_cast<double>(next_u64() >> 11) * kInv53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 2.0 * std::numbers::pi * u2;
  return {r * std::cos(a), r * std::sin(a)};
}

ToyProblemResult run_rosenbrock(const ToyProblemConfig& cfg) {
  validate(cfg);
  const SingleThreadScope single_thread;
  const auto M = static_cast<std::size_t>(cfg.sync.sites);

  // Site m owns elements [2m, 2m + 2) of x and g, and its own optimizer (u, v).
  std::vector<float> x(2 * M), g(2 * M);
  for (std::size_t m = 0; m < M; ++m) {
    x[2 * m] = cfg.start[0];
    x[2 * m + 1] = cfg.start[1];
  }
  optim::OptimizerConfig ocfg = cfg.optimizer;
  ocfg.weight_decay = 0.0f;
  std::vector<optim::Optimizer> opts;
  opts.reserve(M);
  for (std::size_t m = 0; m < M; ++m) opts.emplace_back(ocfg, std::size_t{2});
  std::vector<Replica> reps;
  reps.reserve(M);
  for (std::size_t m = 0; m < M; ++m)
    reps.push_back(
        {std::span<float>(x).subspan(2 * m, 2), std::span<float>(g).subspan(2 * m, 2), &opts[m]});

  std::vector<NoiseStream> noise;
  noise.reserve(M);
  for (std::size_t m = 0; m < M; ++m) noise.emplace_back(cfg.seed, m);

  const SyncPolicy policy(cfg.sync);
  VirtualAverager averager(cfg.sync.sites);
  averager.set_weights(cfg.weights);
  double total_weight = 0.0;
  for (std::size_t m = 0; m < M; ++m) total_weight += cfg.weights.empty() ? 1.0 : cfg.weights[m];
  const auto sigma = static_cast<double>(cfg.sigma);

  ToyProblemResult res;
  res.distance.reserve(static_cast<std::size_t>(cfg.steps) + 1);
  res.site_distance.reserve(static_cast<std::size_t>(cfg.steps) + 1);
  auto record = [&] {
    double s1 = 0.0, s2 = 0.0, sd = 0.0;
    for (std::size_t m = 0; m < M; ++m) {
      const auto x1 = static_cast<double>(x[2 * m]), x2 = static_cast<double>(x[2 * m + 1]);
      const double w = cfg.weights.empty() ? 1.0 : cfg.weights[m];
      s1 += w * x1;
      s2 += w * x2;
      sd += std::hypot(x1 - 1.0, x2 - 1.0);
    }
    const auto inv = 1.0 / static_cast<double>(M);
    res.final_mean_x = cfg.weights.empty()
                           ? std::array<double, 2>{s1 * inv, s2 * inv}
                           : std::array<double, 2>{s1 / total_weight, s2 / total_weight};
    res.distance.push_back(std::hypot(res.final_mean_x[0] - 1.0, res.final_mean_x[1] - 1.0));
    res.site_distance.push_back(sd * inv);
  };
  record();

  // The DES-LOC order (gradient at the un-averaged x, due averages, local update) is the
  // trainer's: run_synced_step.
  auto gradient = [&](std::size_t m) {
    const auto grad = rosenbrock_gradient(x[2 * m], x[2 * m + 1]);
    const auto z = noise[m].normal_pair();
    g[2 * m] = static_cast<float>(grad[0] + sigma * z[0]);
    g[2 * m + 1] = static_cast<float>(grad[1] + sigma * z[1]);
  };
  for (std::int64_t t = 1; t <= cfg.steps; ++t) {
    run_synced_step(t, policy, averager, reps, gradient, cfg.lr,
                    {.reset_step_count = cfg.reset_step_count});
    record();
  }
  res.final_loss = rosenbrock(res.final_mean_x[0], res.final_mean_x[1]);
  res.traffic = averager.traffic(0);
  return res;
}

}  // namespace desloc::sync
