// The CPU backend of the GPT model: CBLAS GEMMs and OpenMP loops.
#pragma once

#include <memory>

#include "desloc/model/model.hpp"

namespace desloc::model {

std::unique_ptr<Model> make_cpu_gpt(const GptConfig& cfg, const BackendOptions& opts);

}  // namespace desloc::model
