// Backend factory: the only place in the trainer that knows which backends were built.
#include "desloc/core/error.hpp"
#include "desloc/model/model.hpp"
#include "model/cpu/gpt_cpu.hpp"
#ifdef DESLOC_HAVE_CUDA
#include "model/cuda/gpt_cuda.hpp"
#endif

namespace desloc::model {

bool backend_available(Backend backend) {
  if (backend == Backend::kCpu) return true;
#ifdef DESLOC_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

bool backend_compiled(Backend backend) {
  if (backend == Backend::kCpu) return true;
#ifdef DESLOC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Model> make_model(const GptConfig& cfg, const BackendOptions& opts) {
  cfg.validate();
  if (opts.backend == Backend::kCpu) return make_cpu_gpt(cfg, opts);
#ifdef DESLOC_HAVE_CUDA
  if (cuda_device_count() == 0)
    throw ConfigError("train.backend = \"cuda\" but no CUDA device is visible; use \"cpu\"");
  return make_cuda_gpt(cfg, opts);
#else
  throw ConfigError(
      "train.backend = \"cuda\" but this desloc was built without CUDA "
      "(nvcc, cuBLAS or NCCL not found at configure time); use \"cpu\"");
#endif
}

}  // namespace desloc::model
