// Checked helpers for cudaError_t and cublasStatus_t (see cuda_check.hpp).
#include "desloc/core/cuda_check.hpp"

#include <string>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"

namespace desloc {

namespace {

std::string cuda_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

std::string cublas_text(cublasStatus_t status) {
  return std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")";
}

}  // namespace

void check_cuda(cudaError_t status, const char* call, std::string_view context,
                std::source_location loc) {
  if (status == cudaSuccess) return;
  std::string hint;
  if (!context.empty()) hint = std::string(" (") + std::string(context) + ")";
  if (status == cudaErrorMemoryAllocation)
    hint += "; lower the batch size (max_batch), the context or the model size";
  else if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver)
    hint += "; check nvidia-smi and the driver, or use backend \"cpu\"";
  throw DeviceError(std::string("CUDA call `") + call + "` failed: " + cuda_text(status) + hint,
                    loc);
}

void check_cublas(cublasStatus_t status, const char* call, std::source_location loc) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw DeviceError(std::string("cuBLAS call `") + call + "` failed: " + cublas_text(status), loc);
}

void warn_cuda(cudaError_t status, const char* call) noexcept {
  if (status == cudaSuccess) return;
  try {
    log::warn("CUDA call `{}` failed during cleanup: {}", call, cuda_text(status));
  } catch (...) {
  }
}

void warn_cublas(cublasStatus_t status, const char* call) noexcept {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  try {
    log::warn("cuBLAS call `{}` failed during cleanup: {}", call, cublas_text(status));
  } catch (...) {
  }
}

}  // namespace desloc
