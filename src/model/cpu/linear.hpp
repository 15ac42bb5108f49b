// Linear layer y = residual + x @ W^T + b with W stored (out, in) like torch.nn.Linear.
// The optional residual operand fuses the pre-LN block's skip connection into the GEMM's
// output (beta = 1), so the residual stream is never read and written in a separate pass.
#pragma once

namespace desloc::model::cpu {

// out (N, OC) = [residual (N, OC)] + inp (N, IC) @ weight^T (IC, OC) + [bias (OC)].
// residual and bias may be null; residual may alias out.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const float* residual, int N, int IC, int OC);

// dinp (N, IC) = dout (N, OC) @ weight (OC, IC)            (overwritten; skipped when null)
// dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC)
// dbias (OC) += sum over rows of dout                       (skipped when null)
// The residual's gradient is dout itself, so the caller keeps dout as the skip-path gradient.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);

// out (C) += sum over the N rows of x (N, C); deterministic for a fixed thread count.
void column_sum_accumulate(float* out, const float* x, int N, int C);

}  // namespace desloc::model::cpu
