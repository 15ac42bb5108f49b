// The optional outer optimizer for parameter averages (DiLoCo, Douillard et al. 2023):
// Nesterov momentum on the pseudo-gradient delta = x_ref - mean(x), where x_ref is the
// parameter value all sites agreed on at the previous average.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace desloc::sync {

class OuterNesterov {
 public:
  OuterNesterov(float lr, float momentum) : lr_(lr), momentum_(momentum) {}
  // Sets x_ref to the sites' common starting point (called once, before training).
  void reset(std::span<const float> x);
  // mean_x holds mean(x) on entry; on exit it holds the new agreed parameters:
  //   delta = x_ref - mean_x; m = mu m + delta; x_new = x_ref - lr (delta + mu m);  x_ref = x_new
  // With lr = 1 and mu = 0 this is plain averaging (x_new = mean_x).
  void step(std::span<float> mean_x);
  // The same on elements [offset, offset + mean_x.size()) of x: one fragment of the parameters
  // (sync.fragments), whose x_ref and momentum alone move (Streaming DiLoCo's outer step per
  // fragment).
  void step(std::span<float> mean_x, std::size_t offset);
  std::vector<float>& reference() { return x_ref_; }
  std::vector<float>& momentum() { return m_; }
  const std::vector<float>& reference() const { return x_ref_; }
  const std::vector<float>& momentum() const { return m_; }

 private:
  float lr_, momentum_;
  std::vector<float> x_ref_, m_;
};

}  // namespace desloc::sync
