// The CUDA backend of the GPT model: cuBLAS GEMMs, desloc kernels, fp32 master weights.
#pragma once

#include <memory>

#include "desloc/model/model.hpp"

namespace desloc::model {

std::unique_ptr<Model> make_cuda_gpt(const GptConfig& cfg, const BackendOptions& opts);
// Number of CUDA devices visible (0 when the driver or device is absent; never throws).
int cuda_device_count();

}  // namespace desloc::model
