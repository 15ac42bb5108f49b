// Deterministic GPT-2 style parameter initialisation.
#include <cmath>
#include <random>
#include <string>

#include "desloc/model/model.hpp"

namespace desloc::model {

void init_params(const ParamLayout& layout, const GptConfig& cfg, std::uint64_t seed,
                 std::span<float> params) {
  // One generator per tensor, seeded from (seed, tensor index): changing one tensor's size
  // does not shift every other tensor's values.
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.layers));
  for (std::size_t i = 0; i < layout.tensors().size(); ++i) {
    const auto& t = layout.tensors()[i];
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + i + 1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto out = params.subspan(t.offset, t.numel);
    const bool is_norm_gain =
        t.name.ends_with("ln1.weight") || t.name.ends_with("ln2.weight") || t.name == "lnf.weight";
    if (is_norm_gain) {
      for (auto& x : out) x = 1.0f;
    } else if (t.shape.size() == 1) {
      for (auto& x : out) x = 0.0f;  // biases
    } else {
      const bool residual =
          t.name.ends_with("attn.proj.weight") || t.name.ends_with("mlp.proj.weight");
      const float stdev = residual ? residual_std : 0.02f;
      for (auto& x : out) x = stdev * normal(rng);
    }
  }
}

}  // namespace desloc::model
