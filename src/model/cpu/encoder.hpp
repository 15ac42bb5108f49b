// Token + position embedding: x0 = wte[token] + wpe[position].
#pragma once

#include <cstdint>

namespace desloc::model::cpu {

// out (B, T, C) = wte[inp[b, t]] (V, C) + wpe[t] (T_max, C). Token ids must be in [0, V).
void encoder_forward(float* out, const std::int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C);

// dwte (V, C) += scatter of dout by token id; dwpe (T_max, C) += sum over b of dout.
// Each thread owns a slice of channels (dwte) or positions (dwpe), so no two threads write
// the same element and the summation order is fixed.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                      int T, int C);

}  // namespace desloc::model::cpu
