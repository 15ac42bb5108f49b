// Checked calls into the CUDA runtime and cuBLAS, shared by the model and the NCCL transport:
// one helper per foreign status type. The macro captures the call text; the function turns a
// failure into a DeviceError, which no membership epoch can mend (the trainer's recovery does
// not catch it: the rank ends with the message).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <source_location>
#include <string_view>

namespace desloc {

// Throws DeviceError naming the call, the CUDA error, `context` (what the call was for, when
// given) and a hint for the common failures (out of memory, no device).
void check_cuda(cudaError_t status, const char* call, std::string_view context = {},
                std::source_location loc = std::source_location::current());
// Throws DeviceError naming the call and the cuBLAS status.
void check_cublas(cublasStatus_t status, const char* call,
                  std::source_location loc = std::source_location::current());

// For destructors, which must not throw: logs a warning instead.
void warn_cuda(cudaError_t status, const char* call) noexcept;
void warn_cublas(cublasStatus_t status, const char* call) noexcept;

}  // namespace desloc

// DESLOC_CUDA_CHECK(call) or DESLOC_CUDA_CHECK(call, context)
#define DESLOC_CUDA_CHECK(call, ...) ::desloc::check_cuda((call), #call __VA_OPT__(, ) __VA_ARGS__)
#define DESLOC_CUBLAS_CHECK(call) ::desloc::check_cublas((call), #call)
