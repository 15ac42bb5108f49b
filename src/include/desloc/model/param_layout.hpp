// Where each named parameter tensor lives inside the flat parameter buffer x.
// x, the gradient and the optimizer states u and v all share this layout, so an averager
// can address "state s, tensor k, elements [a, b)" without knowing about the model.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "desloc/model/gpt_config.hpp"

namespace desloc::model {

struct ParamTensor {
  std::string name;        // PyTorch-style name, e.g. "h.0.attn.qkv.weight"
  std::vector<int> shape;  // row-major, e.g. {3C, C} for a Linear weight (out, in)
  std::size_t offset = 0;  // in floats from the start of the flat buffer
  std::size_t numel = 0;
  bool decay = false;  // weight decay applies (matrices and embeddings, not norms/biases)
};

// Per-layer tensors, in this order, for layer l:
//   h.l.ln1.weight (C), h.l.ln1.bias (C),
//   h.l.attn.qkv.weight (3C, C), h.l.attn.qkv.bias (3C),
//   h.l.attn.proj.weight (C, C), h.l.attn.proj.bias (C),
//   h.l.ln2.weight (C), h.l.ln2.bias (C),
//   h.l.mlp.fc.weight (4C, C), h.l.mlp.fc.bias (4C),
//   h.l.mlp.proj.weight (C, 4C), h.l.mlp.proj.bias (C)
// preceded by wte (V, C), wpe (T, C) and followed by lnf.weight (C), lnf.bias (C).
// The LM head is tied to wte: logits = lnf(h) @ wte^T.
// Linear weights are stored (out, in) like torch.nn.Linear: y = x @ W^T + b.
class ParamLayout {
 public:
  // Throws ConfigError when a size does not fit its type: 4 * d_model must fit an int (the
  // shapes), and the total must fit a size_t of floats.
  explicit ParamLayout(const GptConfig& cfg);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  std::size_t total() const { return total_; }
  const ParamTensor& find(const std::string& name) const;  // throws Error if absent

  // Index of the first tensor of layer l; each layer has kTensorsPerLayer tensors.
  static constexpr int kTensorsPerLayer = 12;
  static constexpr int kWte = 0, kWpe = 1, kFirstLayer = 2;
  // Offsets within a layer's group of tensors.
  enum LayerTensor {
    kLn1W = 0,
    kLn1B,
    kQkvW,
    kQkvB,
    kAttnProjW,
    kAttnProjB,
    kLn2W,
    kLn2B,
    kFcW,
    kFcB,
    kFcProjW,
    kFcProjB
  };
  const ParamTensor& layer(int l, LayerTensor t) const {
    return tensors_[kFirstLayer + l * kTensorsPerLayer + t];
  }
  const ParamTensor& wte() const { return tensors_[kWte]; }
  const ParamTensor& wpe() const { return tensors_[kWpe]; }
  const ParamTensor& lnf_w() const { return tensors_[tensors_.size() - 2]; }
  const ParamTensor& lnf_b() const { return tensors_[tensors_.size() - 1]; }

 private:
  std::vector<ParamTensor> tensors_;
  std::size_t total_ = 0;
};

// ParamLayout(cfg).total() in closed form, V C + T C + L (12 C^2 + 13 C) + 2 C, in double so
// that no product overflows: for planning models too large to build on this machine, and for
// estimating a job's memory before anything is allocated.
double parameter_count(const GptConfig& cfg);

}  // namespace desloc::model
