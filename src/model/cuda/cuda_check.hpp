// Checked calls into the CUDA runtime and cuBLAS: one helper per foreign status type.
// The macro captures the call text; the function turns a failure into a TransportError.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <source_location>

namespace desloc::model::cuda {

// Throws TransportError naming the call, the CUDA error and the throw site.
void check_cuda(cudaError_t status, const char* call,
                std::source_location loc = std::source_location::current());
// Throws TransportError naming the call and the cuBLAS status.
void check_cublas(cublasStatus_t status, const char* call,
                  std::source_location loc = std::source_location::current());

// For destructors, which must not throw: logs a warning instead.
void warn_cuda(cudaError_t status, const char* call) noexcept;
void warn_cublas(cublasStatus_t status, const char* call) noexcept;

}  // namespace desloc::model::cuda

#define DESLOC_CUDA_CHECK(call) ::desloc::model::cuda::check_cuda((call), #call)
#define DESLOC_CUBLAS_CHECK(call) ::desloc::model::cuda::check_cublas((call), #call)
