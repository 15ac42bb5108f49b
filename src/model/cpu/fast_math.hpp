// Branch-free exp/tanh that GCC vectorises without -ffast-math (glibc's expf/tanhf stay scalar).
// Accurate to about 2 ulp, which is far inside the 1e-4 PyTorch parity budget.
#pragma once

#include <bit>
#include <cstdint>

namespace desloc::model::cpu {

// Cephes-style expf: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n by
// building the exponent bits. Inputs are clamped to [-87.3, 88.3] so 2^n stays a normal
// float; below the clamp the result is ~1e-38 instead of 0, which softmax cannot see.
inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  // Round to nearest by adding and removing 1.5 * 2^23 (floorf would not vectorise without
  // -fno-trapping-math); exact for |x * log2e| < 2^22.
  constexpr float kRoundMagic = 12582912.0f;
  const float n = (x * kLog2e + kRoundMagic) - kRoundMagic;
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// tanh(u) = 1 - 2 / (1 + e^{2u}); saturates to +-1 through the clamp in exp_approx. Absolute
// error ~1e-7 near 0, which is what GELU's 0.5 x (1 + tanh) needs.
inline float tanh_approx(float u) { return 1.0f - 2.0f / (1.0f + exp_approx(2.0f * u)); }

}  // namespace desloc::model::cpu
