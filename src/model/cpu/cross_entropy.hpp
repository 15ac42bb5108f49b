// Fused softmax + cross-entropy over the tied LM head's logits (the head itself is
// linear_forward/linear_backward with wte as the weight and no bias).
#pragma once

#include <cstdint>

namespace desloc::model::cpu {

// losses (N) = logsumexp(logits[i]) - logits[i, targets[i]] for logits (N, V).
// When backward, logits is overwritten in place with dloss * (softmax(logits) - onehot),
// so the (N, V) buffer is read twice and written once and no probabilities are materialised.
void softmax_cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V,
                           bool backward, float dloss);

}  // namespace desloc::model::cpu
