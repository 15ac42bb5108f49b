// Backend factory: the only place in the trainer that knows which backends were built.
#include "desloc/core/error.hpp"
#include "desloc/model/model.hpp"
#include "model/cpu/gpt_cpu.hpp"
#ifdef DESLOC_HAVE_CUDA
#include "model/cuda/gpt_cuda.hpp"
#endif

namespace desloc::model {

bool backend_available(const std::string& backend) {
  if (backend == "cpu") return true;
#ifdef DESLOC_HAVE_CUDA
  if (backend == "cuda") return cuda_device_count() > 0;
#endif
  return false;
}

bool backend_compiled(const std::string& backend) {
  if (backend == "cpu") return true;
#ifdef DESLOC_HAVE_CUDA
  if (backend == "cuda") return true;
#endif
  return false;
}

std::unique_ptr<Model> make_model(const GptConfig& cfg, const BackendOptions& opts) {
  cfg.validate();
  if (opts.backend == "cpu") return make_cpu_gpt(cfg, opts);
  if (opts.backend == "cuda") {
#ifdef DESLOC_HAVE_CUDA
    if (cuda_device_count() == 0)
      throw ConfigError("model.backend = \"cuda\" but no CUDA device is visible; use \"cpu\"");
    return make_cuda_gpt(cfg, opts);
#else
    throw ConfigError(
        "model.backend = \"cuda\" but this desloc was built without CUDA "
        "(nvcc, cuBLAS or NCCL not found at configure time); use \"cpu\"");
#endif
  }
  throw ConfigError("model.backend = \"" + opts.backend +
                    "\" is unknown; expected \"cpu\" or \"cuda\"");
}

}  // namespace desloc::model
