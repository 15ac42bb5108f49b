// RAII owners of CUDA streams, cuBLAS handles and memory (see cuda_handles.hpp).
#include "cuda_handles.hpp"

#include <string>

#include "desloc/core/error.hpp"

namespace desloc::model::cuda {

CudaStream::CudaStream() {
  DESLOC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) warn_cuda(cudaStreamDestroy(stream_), "cudaStreamDestroy");
}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) warn_cuda(cudaStreamDestroy(stream_), "cudaStreamDestroy");
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void CudaStream::synchronize() const { DESLOC_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

CublasHandle::CublasHandle(cudaStream_t stream) {
  DESLOC_CUBLAS_CHECK(cublasCreate(&handle_));
  try {
    DESLOC_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    // fp32 GEMMs stay true fp32: CUBLAS_DEFAULT_MATH never uses TF32 tensor cores for
    // cublasSgemm (only CUBLAS_TF32_TENSOR_OP_MATH does). A later bf16 compute path will
    // use cublasGemmEx with explicit compute types instead of changing this mode.
    DESLOC_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    DESLOC_CUBLAS_CHECK(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST));
    // Bitwise-reproducible results run to run (the default, stated explicitly).
    DESLOC_CUBLAS_CHECK(cublasSetAtomicsMode(handle_, CUBLAS_ATOMICS_NOT_ALLOWED));
  } catch (...) {
    warn_cublas(cublasDestroy(handle_), "cublasDestroy");
    handle_ = nullptr;
    throw;
  }
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) warn_cublas(cublasDestroy(handle_), "cublasDestroy");
}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) warn_cublas(cublasDestroy(handle_), "cublasDestroy");
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void free_device(void* ptr) noexcept {
  if (ptr != nullptr) warn_cuda(cudaFree(ptr), "cudaFree");
}

void free_pinned(void* ptr) noexcept {
  if (ptr != nullptr) warn_cuda(cudaFreeHost(ptr), "cudaFreeHost");
}

void* alloc_device(std::size_t bytes, const char* what) {
  void* ptr = nullptr;
  if (bytes == 0) return nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear it so later calls do not report it again
    check_cuda(
        status,
        (std::string("cudaMalloc(") + std::to_string(bytes) + " bytes for " + what + ")").c_str());
  }
  return ptr;
}

void* alloc_pinned(std::size_t bytes, const char* what) {
  void* ptr = nullptr;
  if (bytes == 0) return nullptr;
  const cudaError_t status = cudaMallocHost(&ptr, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    check_cuda(status,
               (std::string("cudaMallocHost(") + std::to_string(bytes) + " bytes for " + what + ")")
                   .c_str());
  }
  return ptr;
}

}  // namespace desloc::model::cuda
