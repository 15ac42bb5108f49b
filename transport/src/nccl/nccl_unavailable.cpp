// The NCCL factory in a build without CUDA/NCCL: every entry point says so.
#include "desloc/core/error.hpp"
#include "desloc/transport/nccl_collective.hpp"

namespace desloc::transport {

bool nccl_available() { return false; }
int cuda_device_count() { return 0; }

NcclId nccl_unique_id() {
  throw TransportError(
      "this desloc was built without NCCL (no CUDA toolkit with NCCL found at configure time); "
      "use train.backend = \"cpu\" or rebuild with CUDA");
}

std::unique_ptr<Collective> make_nccl_collective(int, int, const NcclId&, int,
                                                 const CollectiveOptions&) {
  nccl_unique_id();
  return nullptr;
}

}  // namespace desloc::transport
