// The shared CUDA/cuBLAS checker: a failure is a DeviceError (which elastic recovery does not
// catch), names the call and what it was for, and hints at the fix. Needs the CUDA runtime
// library only, not a device, so it runs in every CUDA build.
#include "desloc/core/cuda_check.hpp"

#include <gtest/gtest.h>

#include <string>

#include "desloc/core/error.hpp"

using namespace desloc;

TEST(CudaCheck, OutOfMemoryIsADeviceErrorNamingTheCallAndTheFix) {
  try {
    DESLOC_CUDA_CHECK(cudaErrorMemoryAllocation, "the activations");
    FAIL() << "no throw";
  } catch (const TransportError&) {
    FAIL() << "a device failure must not look like a transport failure (recovery would catch it)";
  } catch (const DeviceError& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
    EXPECT_NE(m.find("the activations"), std::string::npos) << m;
    EXPECT_NE(m.find("lower the batch size"), std::string::npos) << m;
  }
}

TEST(CudaCheck, CublasFailureIsADeviceError) {
  EXPECT_THROW(DESLOC_CUBLAS_CHECK(CUBLAS_STATUS_ALLOC_FAILED), DeviceError);
  EXPECT_NO_THROW(DESLOC_CUDA_CHECK(cudaSuccess));
  EXPECT_NO_THROW(DESLOC_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
}
