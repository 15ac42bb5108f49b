// Move-only RAII owners for the CUDA handles the backend holds: a stream, a cuBLAS handle,
// device memory and pinned host memory. Destructors log failures and never throw.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>

#include "desloc/core/cuda_check.hpp"

namespace desloc::model::cuda {

class CudaStream {
 public:
  CudaStream();  // a non-blocking stream on the current device
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

class CublasHandle {
 public:
  // A handle bound to `stream`, in true-fp32 math (no TF32), host pointer mode.
  explicit CublasHandle(cudaStream_t stream);
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Frees device or pinned-host memory; the two buffers below differ only in these.
void free_device(void* ptr) noexcept;
void free_pinned(void* ptr) noexcept;
void* alloc_device(std::size_t bytes, const char* what);
void* alloc_pinned(std::size_t bytes, const char* what);

// `count` elements of T in device memory (uninitialised).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t count, const char* what)
      : ptr_(static_cast<T*>(alloc_device(count * sizeof(T), what))), count_(count) {}
  ~DeviceBuffer() { free_device(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      free_device(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  std::size_t size() const { return count_; }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

// `count` elements of T in page-locked host memory, zero-initialised; async copies to and
// from it overlap with the host.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(std::size_t count, const char* what)
      : ptr_(static_cast<T*>(alloc_pinned(count * sizeof(T), what))), count_(count) {
    for (std::size_t i = 0; i < count_; ++i) ptr_[i] = T{};
  }
  ~PinnedBuffer() { free_pinned(ptr_); }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      free_pinned(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  T* get() const { return ptr_; }
  std::size_t size() const { return count_; }
  std::span<T> span() const { return {ptr_, count_}; }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace desloc::model::cuda
