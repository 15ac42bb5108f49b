// Builds the flat parameter layout shared by x, the gradient, u and v.
#include "desloc/model/param_layout.hpp"

#include "desloc/core/error.hpp"

namespace desloc::model {

ParamLayout::ParamLayout(const GptConfig& cfg) {
  const int C = cfg.d_model;
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
