// Causal multi-head self-attention core: softmax(q k^T / sqrt(hd)) v for every (batch, head).
// q, k, v are read in place from the fused (B, T, 3C) qkv buffer through leading-dimension
// strides; each (b, head) is a few small CBLAS GEMMs over causal row blocks, so the upper
// triangle of the (T, T) score matrix is mostly never computed.
#pragma once

namespace desloc::model::cpu {

// out (B, T, C) = per head h: softmax(mask(q_h k_h^T / sqrt(hd))) v_h, with
// q_h = qkv[:, :, h*hd : (h+1)*hd], k_h at +C, v_h at +2C; hd = C / NH.
// att (B, NH, T, T) keeps the probabilities for backward (entries above the diagonal are
// unspecified beyond the diagonal block and never read).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);

// dqkv (B, T, 3C) = gradient of the inputs (overwritten); scratch (B, NH, T, T).
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

}  // namespace desloc::model::cpu
