// GELU with the tanh approximation, as torch.nn.GELU(approximate='tanh').
#pragma once

namespace desloc::model::cpu {

// out (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); out may alias inp.
void gelu_forward(float* out, const float* inp, long n);

// dinp (n) = dout * gelu'(inp); dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, long n);

}  // namespace desloc::model::cpu
