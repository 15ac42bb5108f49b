// Builds the flat parameter layout shared by x, the gradient, u and v.
#include "desloc/model/param_layout.hpp"

#include <fmt/format.h>

#include <limits>

#include "desloc/core/error.hpp"

namespace desloc::model {

double parameter_count(const GptConfig& cfg) {
  const double V = cfg.vocab, T = cfg.context, L = cfg.layers, C = cfg.d_model;
  return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
}

ParamLayout::ParamLayout(const GptConfig& cfg) {
  const int C = cfg.d_model;
  if (4.0 * C > std::numeric_limits<int>::max())
    throw ConfigError(fmt::format(
        "model.d_model = {} is too large: the MLP's 4 * d_model rows must fit a 32-bit int", C));
  // 2^53: every size below stays exact in the double of parameter_count, and a size_t of
  // floats is far from overflowing.
  if (parameter_count(cfg) > 9007199254740992.0)
    throw ConfigError(
        fmt::format("the model has {:.3g} parameters, more than 2^53; reduce "
                    "model.layers or model.d_model",
                    parameter_count(cfg)));
  auto add = [&](std::string name, std::vector<int> shape, bool decay) {
    std::size_t n = 1;
    for (int d : shape) n *= static_cast<std::size_t>(d);
    tensors_.push_back({std::move(name), std::move(shape), total_, n, decay});
    total_ += n;
  };
  add("wte", {cfg.vocab, C}, true);
  add("wpe", {cfg.context, C}, true);
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    add(p + "ln1.weight", {C}, false);
    add(p + "ln1.bias", {C}, false);
    add(p + "attn.qkv.weight", {3 * C, C}, true);
    add(p + "attn.qkv.bias", {3 * C}, false);
    add(p + "attn.proj.weight", {C, C}, true);
    add(p + "attn.proj.bias", {C}, false);
    add(p + "ln2.weight", {C}, false);
    add(p + "ln2.bias", {C}, false);
    add(p + "mlp.fc.weight", {4 * C, C}, true);
    add(p + "mlp.fc.bias", {4 * C}, false);
    add(p + "mlp.proj.weight", {C, 4 * C}, true);
    add(p + "mlp.proj.bias", {C}, false);
  }
  add("lnf.weight", {C}, false);
  add("lnf.bias", {C}, false);
}

const ParamTensor& ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw Error("no parameter tensor named '" + name + "' in the model layout");
}

}  // namespace desloc::model
